# Two claims of one node id meet (S1 across primaries), on PostgreSQL 16 or
# later (origin = none).  Servers A (node 1) and B (node 2) replicate both
# ways and both draw.  Then C, also given node id 1, draws first, so that it
# holds a claim of its own, and joins: A subscribes to C and C to A, both
# with origin = none and copy_data = true.  Both claims of node 1 must stand
# side by side on A and on C (every table sync reaches 'r': no duplicate key
# on node_claims_pkey), and the later one, C's, must be refused with 55000
# naming both claims: sharded_nextval and counter_incr, in a new session and
# in one that had checked its claim before A's arrived.  A keeps drawing
# (also a session that had checked its claim before C's arrived), and B too.
# Last, C's claim dated a year earlier: the order is the claims' own, so A
# is refused (also a session that had checked its claim) and C draws.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

my %node;
for ([ A => 1 ], [ B => 2 ], [ C => 1 ])
{
	my ($n, $id) = @$_;
	$node{$n} = ssq_node(
		"claims_$n",
		allows_streaming => 'logical',
		start => 0,
		conf => "max_worker_processes = 16\nmax_logical_replication_workers = 8\nsharded_seq.node_id = $id\n");
}
plan skip_all => 'needs PostgreSQL 16 or later (subscriptions with origin = none)'
  if $node{A}->pg_version < 16;

sub q1 { my ($n, $sql) = @_; return $node{$n}->safe_psql('app', $sql); }

# start(NODE, ID): started, with database app: the extension, orders and
# the publication grp of orders and replicated_tables()
sub start
{
	my ($n, $id) = @_;
	$node{$n}->start;
	ssq_db($node{$n}, 'app');
	q1($n, q{
CREATE TABLE orders (
    id      bigint PRIMARY KEY DEFAULT sharded_nextval('orders_id'),
    node    text NOT NULL
);
SELECT format('CREATE PUBLICATION grp FOR TABLE orders, %s', string_agg(t::text, ', '))
  FROM sharded_seq.replicated_tables() t \gexec});
	is(q1($n, 'SELECT sharded_seq.node_id()'), $id, "$n is node $id");
	return;
}
# its first use claims the node id
sub sequence { q1($_[0], "SELECT sharded_seq.create_sequence('orders_id')"); return; }
sub subscribe
{
	my ($n, $from, $copy) = @_;
	q1($n, "CREATE SUBSCRIPTION app_\L${n}\E_from_\L${from}\E CONNECTION '"
		  . $node{$from}->connstr
		  . " dbname=app' PUBLICATION grp WITH (origin = none, copy_data = $copy)");
	return;
}
sub synced
{
	my ($n, $from) = @_;
	return q1($n, "SELECT string_agg(r.srrelid::regclass || '=' || r.srsubstate::text, ' ' ORDER BY r.srrelid::regclass::text)
                    FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid
                   WHERE s.subname = 'app_\L${n}\E_from_\L${from}\E'");
}
sub all_ready
{
	my ($n, $from) = @_;
	return $node{$n}->poll_query_until('app',
		"SELECT count(*) FILTER (WHERE r.srsubstate <> 'r') || ' ' || count(*)
           FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid
          WHERE s.subname = 'app_\L${n}\E_from_\L${from}\E'", '0 4');
}
# the claims of node 1 on NODE, the one that holds the id first (ClaimCompare)
sub claims_of_1
{
	return q1($_[0], q{SELECT string_agg(system_identifier || '/' || database, ' ' ORDER BY claimed_at,
                             length(system_identifier), system_identifier COLLATE "C", database COLLATE "C")
                        FROM sharded_seq.node_claims WHERE node_id = 1});
}
sub sysid { return q1($_[0], 'SELECT system_identifier FROM pg_control_system()'); }
# draws(NODE): a value and an order drawn on NODE, and the counter incremented
sub draws
{
	my ($n) = @_;
	my ($rc, $out, $err) = $node{$n}->psql('app',
		"INSERT INTO orders (node) VALUES ('$n') RETURNING id >> 53; SELECT counter_incr('orders_count') > 0");
	return $out . $err;
}
# a session on NODE whose errors show their SQLSTATE
sub session
{
	my $h = $node{ $_[0] }->background_psql('app', on_error_stop => 0);
	$h->query_safe('\set VERBOSITY verbose');
	return $h;
}

###########################################################################
note('A (node 1) and B (node 2), active-active, both drawing');
start('A', 1);
start('B', 2);
subscribe('A', 'B', 'false');
subscribe('B', 'A', 'false');
# after the subscriptions, so that each claim reaches the other
sequence('A');
sequence('B');
q1('A', "SELECT sharded_seq.create_counter('orders_count')");
$node{B}->poll_query_until('app', 'SELECT count(*) = 1 FROM sharded_seq.counter_config')
  or die 'the counter did not reach B';
is(draws('A'), "1\nt", 'A draws as node 1');
is(draws('B'), "2\nt", 'B draws as node 2');
$node{$_}->poll_query_until('app',
	q{SELECT string_agg(node_id::text, ',' ORDER BY node_id) FROM sharded_seq.node_claims}, '1,2')
  or die "the claims did not reach $_"
  for qw(A B);
my $sysA = sysid('A');
# a session on A that checked its claim before C's arrives
my $a1 = session('A');
is($a1->query_safe("SELECT sharded_nextval('orders_id') >> 53"), '1', 'a session on A draws as node 1');

###########################################################################
note('C, given node id 1 too, draws before it joins');
start('C', 1);
sequence('C');
my $sysC = sysid('C');
my $c1 = session('C');
is($c1->query_safe("SELECT sharded_nextval('orders_id') >> 53"), '1', 'C draws as node 1 before joining');
is(claims_of_1('C'), "$sysC/app", 'C holds a claim of its own');
note('RESULT claims of node 1 before C joins: A: ' . claims_of_1('A') . '; C: ' . claims_of_1('C'));

note('A subscribes to C, then C to A, both with copy_data = true');
subscribe('A', 'C', 'true');
ok(all_ready('A', 'C'), "A's subscription to C reaches 'r' for every table") or diag(synced('A', 'C'));
subscribe('C', 'A', 'true');
ok(all_ready('C', 'A'), "C's subscription to A reaches 'r' for every table") or diag(synced('C', 'A'));
note("RESULT A's tables from C: " . synced('A', 'C'));
note("RESULT C's tables from A: " . synced('C', 'A'));
for my $n (qw(A C))
{
	my $got = claims_of_1($n);
	note("RESULT claims of node 1 on $n, the holder first: $got");
	is($got, "$sysA/app $sysC/app", "$n holds both claims of node 1, A's first");
}

###########################################################################
note('C, the later claimant, is refused; A and B go on');
my $later = qr/ERROR:  55000: sharded_seq\.node_id 1 is claimed by system $sysA, database "app", earlier than by this one \(system $sysC, database "app"\)/;
for my $stmt ("SELECT sharded_nextval('orders_id')", "SELECT counter_incr('orders_count')",
	"INSERT INTO orders (node) VALUES ('C')")
{
	my ($rc, $out, $err) = $node{C}->psql('app', $stmt, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, $later, "C, new session: '$stmt' refused with 55000, naming both claims");
	like($err, qr/^HINT:.*a node id no other node uses.*DELETE FROM sharded_seq\.node_claims/m,
		'... with a hint on how to resolve it');
	note("RESULT C, new session, $stmt: " . ($err =~ /(ERROR.*)$/m)[0]);
}
for my $stmt ("SELECT sharded_nextval('orders_id')", "SELECT counter_incr('orders_count')")
{
	my ($out, $err) = bg_query($c1, $stmt);
	like($err, $later, "C, the session that had checked its claim before A's arrived: '$stmt' refused (55000)");
	is($out, '', '... and returned nothing');
}
$c1->quit;
my ($out, $err) = bg_query($a1, "SELECT sharded_nextval('orders_id') >> 53");
is("$out$err", '1', "A's session that had checked its claim before C's arrived draws");
$a1->quit;
is(draws('A'), "1\nt", 'A, new session, draws');
is(draws('B'), "2\nt", 'B draws');
ok($node{C}->poll_query_until('app', q{SELECT count(*) = 2 FROM orders WHERE node = 'A'}), "A's orders reach C");

###########################################################################
note("the order is the claims' own: C's claim dated a year earlier (as if C's clock were behind)");
my $a2 = session('A');
is($a2->query_safe("SELECT sharded_nextval('orders_id') >> 53"), '1', 'a session on A draws');
q1('C', "UPDATE sharded_seq.node_claims SET claimed_at = claimed_at - interval '1 year'
          WHERE node_id = 1 AND system_identifier = '$sysC'");
ok( $node{A}->poll_query_until('app',
		"SELECT count(*) = 1 FROM sharded_seq.node_claims WHERE system_identifier = '$sysC' AND claimed_at < now() - interval '300 days'"),
	"the new date of C's claim reaches A");
is(claims_of_1($_), "$sysC/app $sysA/app", "$_ puts C's claim first now") for qw(A C);
($out, $err) = bg_query($a2, "SELECT sharded_nextval('orders_id')");
like($err,
	qr/ERROR:  55000: sharded_seq\.node_id 1 is claimed by system $sysC, database "app", earlier than by this one \(system $sysA, database "app"\)/,
	"A's session that had checked its claim is refused now (55000)");
is($out, '', '... and returned nothing');
$a2->quit;
($out, $err) = ($node{C}->psql('app', "SELECT sharded_nextval('orders_id') >> 53"))[ 1, 2 ];
is("$out$err", '1', 'C draws once its claim is the earlier');

# nothing stopped an apply worker or a table sync
for my $n (qw(A C))
{
	is(q1($n, 'SELECT coalesce(sum(apply_error_count + sync_error_count), 0) FROM pg_stat_subscription_stats'),
		'0', "$n: no apply or sync error in pg_stat_subscription_stats");
	my $dups = () = slurp_file($node{$n}->logfile) =~ /duplicate key/g;
	is($dups, 0, "$n: no duplicate key error in the log");
}

done_testing();

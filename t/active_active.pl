# Active-active on PostgreSQL 16 or later (logical replication both ways with
# origin = none, which 16 brought): S1 and C3 across primaries.  Two servers,
# node ids 1 and 2 (ALTER SYSTEM and a reload), each publishing sharded_seq's
# replicated_tables() and a table orders whose id defaults to
# sharded_nextval('orders_id'), each subscribed to the other.  The sequence is
# created on each node, the counters once, on node 1.  Sessions on both nodes
# at once insert orders and call counter_incr in the same transactions, some
# rolled back, with maintain() running on both, then folding each node's
# grown rows back.  Then: the same committed rows on both nodes, every id in
# its node's range, no apply error in either log or in
# pg_stat_subscription_stats, and every counter equal to the committed rows
# on both nodes.  A revoke made on node 1 must reach a session on node 2 that
# cached the counter (E1, the replica trigger on counter_config).  A third
# server with node id 1 (taken), subscribed with copy_data = true, must
# refuse sharded_nextval and counter_incr with 55000 once the claims have
# reached it.  Last, the same group with node id 0 on both servers must
# collide: node ids are what prevents it.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use ShardedSeq::Node;

my $conf = q{
max_worker_processes = 16
max_logical_replication_workers = 8
sharded_seq.counter_fold_after = 1
log_line_prefix = '%m [%p] %b '
log_statement = none
};
my %node;
for my $n (qw(n1 n2 n3))
{
	$node{$n} = ssq_node($n, allows_streaming => 'logical', conf => $conf, start => 0);
}
plan skip_all => 'needs PostgreSQL 16 or later (subscriptions with origin = none)'
  if $node{n1}->pg_version < 16;
my ($n1, $n2, $n3) = @node{qw(n1 n2 n3)};
$_->start for ($n1, $n2);
my $tmp = $PostgreSQL::Test::Utils::tmp_check;
my ($sessions, $txns) = (4, 1500);

sub q1 { my ($n, $db, $sql) = @_; return $node{$n}->safe_psql($db, $sql); }

# set_node_id(NODE, ID or undef): by ALTER SYSTEM and a reload, awaited
sub set_node_id
{
	my ($n, $id) = @_;
	q1($n, 'postgres', "LOAD 'sharded_seq'; ALTER SYSTEM "
		  . (defined $id ? "SET sharded_seq.node_id = $id" : 'RESET sharded_seq.node_id')
		  . '; SELECT pg_reload_conf()');
	# as a session that loads the library sees it
	my $t0 = time;
	until (q1($n, 'postgres', "LOAD 'sharded_seq'; SHOW sharded_seq.node_id") eq ($id // 0))
	{
		die "$n did not take node id " . ($id // 0)
		  if time - $t0 > $PostgreSQL::Test::Utils::timeout_default;
		usleep(100_000);
	}
	return;
}

my $orders = q{
CREATE TABLE orders (
    id      bigint PRIMARY KEY DEFAULT sharded_nextval('orders_id'),
    node    integer NOT NULL,
    session integer NOT NULL,
    k       integer NOT NULL,
    j       integer NOT NULL
);
};

# group_setup(DB, NODE...): in DB on each NODE, the extension, orders, a
# publication of orders and replicated_tables(), a subscription to every
# other node (origin = none, copy_data = false), and a table only the test's
# maintain() loop reads.  Then orders_id on each node and the counters once,
# on the first, replicated to the others: after the subscriptions, so that
# the claims the first uses make reach every node.
sub group_setup
{
	my ($db, @nodes) = @_;
	for my $n (@nodes)
	{
		ssq_db($node{$n}, $db);
		q1($n, $db, $orders . q{
CREATE TABLE load_done ();
SELECT format('CREATE PUBLICATION grp FOR TABLE orders, %s', string_agg(t::text, ', '))
  FROM sharded_seq.replicated_tables() t \gexec});
	}
	# one at a time: each creates a slot on the other
	for my $n (@nodes)
	{
		for my $m (grep { $_ ne $n } @nodes)
		{
			q1($n, $db,
				    "CREATE SUBSCRIPTION ${db}_${n}_from_${m} CONNECTION '"
				  . $node{$m}->connstr . " dbname=$db"
				  . "' PUBLICATION grp WITH (origin = none, copy_data = false)");
		}
	}
	q1($_, $db, "SELECT sharded_seq.create_sequence('orders_id')") for @nodes;
	q1($nodes[0], $db,
		"SELECT sharded_seq.create_counter('orders_count'), sharded_seq.create_counter('orders_pinned', shards => 4)");
	$node{$_}->poll_query_until($db, 'SELECT count(*) = 2 FROM sharded_seq.counter_config')
	  || die "the counters did not reach $_"
	  for @nodes;
	return;
}

# one session's transactions, each inserting 1-3 orders and adding as many
# to both counters; every 7th rolls back
sub load_sql
{
	my ($id, $s, $n) = @_;
	my $sql = '';
	for my $k (1 .. $n)
	{
		my $r = 1 + ($k + $s) % 3;
		$sql .= "BEGIN;\nINSERT INTO orders (node, session, k, j) SELECT $id, $s, $k, j FROM generate_series(1, $r) j;\n"
		  . "SELECT counter_incr('orders_count', $r), counter_incr('orders_pinned', $r);\n"
		  . ($k % 7 ? "COMMIT;\n" : "ROLLBACK;\n");
	}
	return $sql;
}

sub expected_rows
{
	my ($nodes, $s, $n) = @_;
	my $total = 0;
	for my $i (1 .. $s)
	{
		$total += 1 + ($_ + $i) % 3 for grep { $_ % 7 } 1 .. $n;
	}
	return $total * $nodes;
}

# run_load(DB, STOP, TXNS, NODE...): every node's sessions at once, and a
# loop of maintain() on each node until they end; the sessions' errors
sub run_load
{
	my ($db, $stop, $n, @nodes) = @_;
	my (@runs, @maint, @errfiles);
	my $id = 0;
	for my $nd (@nodes)
	{
		$id++;
		for my $i (1 .. $sessions)
		{
			my $f = "$tmp/load.$db.$nd.$i";
			PostgreSQL::Test::Utils::append_to_file("$f.sql", load_sql($id, $i, $n));
			push @errfiles, "$f.err";
			push @runs,
			  IPC::Run::start(
				[
					$node{$nd}->installed_command('psql'), '-XAtq', '-v', "ON_ERROR_STOP=$stop",
					'-d', $node{$nd}->connstr($db), '-f', "$f.sql"
				],
				'>', '/dev/null', '2>', "$f.err");
		}
		push @maint,
		  IPC::Run::start(
			[
				$node{$nd}->installed_command('psql'), '-XAtq', '-v', 'ON_ERROR_STOP=1',
				'-d', $node{$nd}->connstr($db), '-c', q{DO $$
DECLARE runs int := 0;
BEGIN
    LOOP
        PERFORM sharded_seq.maintain();
        runs := runs + 1;
        COMMIT;
        EXIT WHEN EXISTS (SELECT FROM load_done);
        PERFORM pg_sleep(0.3);
    END LOOP;
    RAISE NOTICE 'maintain() ran % times', runs;
END $$}
			],
			'>', '/dev/null', '2>', "$tmp/maintain.$db.$nd.err");
	}
	$_->finish for @runs;
	q1($_, $db, 'INSERT INTO load_done DEFAULT VALUES') for @nodes;
	for my $i (0 .. $#maint)
	{
		my $fine = $maint[$i]->finish;
		my $err = slurp_file("$tmp/maintain.$db.$nodes[$i].err");
		my ($runs) = $err =~ /maintain\(\) ran (\d+) times/;
		note("RESULT maintain() ran " . ($runs // 0) . " times on $nodes[$i] during the load");
		ok($fine, "maintain() did not fail on $nodes[$i] during the load") or diag($err);
	}
	return join '', map { slurp_file($_) } @errfiles;
}

sub node_state
{
	my ($n, $db) = @_;
	return q1($n, $db, q{
SELECT count(*) || ' ' || md5(coalesce(string_agg(id || ':' || node || ':' || session || ':' || k || ':' || j, ',' ORDER BY id), ''))
       || ' ' || counter_value('orders_count') || ' ' || counter_value('orders_pinned')
       || ' ' || (SELECT md5(string_agg(counter_id || ':' || shard || ':' || value, ',' ORDER BY counter_id, shard))
                    FROM sharded_seq.counter_shards)
  FROM orders});
}

# the error and conflict lines of NODE's log past offset FROM
sub apply_errors
{
	my ($n, $from) = @_;
	my $log = substr(slurp_file($node{$n}->logfile), $from);
	return join '', grep { /ERROR|conflict|duplicate key/ } split /^/, $log;
}

###########################################################################
note('two servers, node ids 1 and 2, publishing to each other');
set_node_id('n1', 1);
set_node_id('n2', 2);
group_setup('app', 'n1', 'n2');
my ($log1, $log2) = (-s $n1->logfile, -s $n2->logfile);
my $t0 = time;
is(run_load('app', 1, $txns, 'n1', 'n2'), '', 'no load session failed');
my $expected = expected_rows(2, $sessions, $txns);
note(sprintf('RESULT load ran %ds; %d rows committed', time - $t0, $expected));
# idle now: maintain() folds each node's grown rows back once they have
# been idle for a second, and the deletes replicate
for my $n (qw(n1 n2))
{
	q1($n, 'app', q{CREATE FUNCTION fold_done() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	PERFORM sharded_seq.maintain();
	RETURN (SELECT count(*) FROM sharded_seq.counter_shards s JOIN sharded_seq.counter_config c ON c.id = s.counter_id
	         WHERE c.name = 'orders_count' AND s.shard / 1024 = sharded_seq.node_id()) = 1;
END $$});
	ok($node{$n}->poll_query_until('app', 'SELECT fold_done()'),
		"maintain() on $n folds its grown rows of orders_count back to one");
}

# replication has caught up when both nodes show the same state with every row
$t0 = time;
my ($s1, $s2, $converged) = ('', '', 0);
while (time - $t0 < $PostgreSQL::Test::Utils::timeout_default)
{
	($s1, $s2) = (node_state('n1', 'app'), node_state('n2', 'app'));
	if ($s1 eq $s2 && (split / /, $s1)[0] == $expected) { $converged = 1; last; }
	usleep(200_000);
}
note(sprintf('RESULT caught up within %ds', time - $t0));
note('RESULT node 1: ' . join(' ', (split / /, $s1)[ 0, 2, 3 ]) . ' (rows, orders_count, orders_pinned)');
note('RESULT node 2: ' . join(' ', (split / /, $s2)[ 0, 2, 3 ]));
ok($converged, "the nodes converge on the $expected committed rows, counter rows and totals");
for my $n (qw(n1 n2))
{
	is(q1($n, 'app', 'SELECT count(*) FROM orders'), $expected, "$n holds every committed row");
	is(q1($n, 'app', 'SELECT count(*) FROM orders WHERE k % 7 = 0'), '0', "$n holds no rolled-back row");
	is(q1($n, 'app', 'SELECT count(*) FROM orders WHERE id >> 53 <> node'), '0', "$n: every id in its node's range");
	is(q1($n, 'app', 'SELECT count(DISTINCT id) FROM orders'), $expected, "$n: no id twice");
	for my $c (qw(orders_count orders_pinned))
	{
		is(q1($n, 'app', "SELECT counter_value('$c')"), $expected, "$n: $c is the committed rows");
		is(q1($n, 'app', "SELECT total FROM sharded_seq.counters WHERE name = '$c'"), $expected,
			"$n: the counters view's total of $c too");
	}
	is( q1($n, 'app', q{SELECT string_agg(DISTINCT (shard / 1024)::text, ',' ORDER BY (shard / 1024)::text) FROM sharded_seq.counter_shards}),
		'1,2', "$n: counter rows of nodes 1 and 2 only");
	is(q1($n, 'app', 'SELECT coalesce(sum(apply_error_count + sync_error_count), 0) FROM pg_stat_subscription_stats'),
		'0', "$n: pg_stat_subscription_stats counts no error");
}
note('RESULT counter rows on node 1: ' . q1('n1', 'app', q{SELECT string_agg(c.name || ' ' || (SELECT count(*) FROM sharded_seq.counter_shards s WHERE s.counter_id = c.id AND s.shard / 1024 = n) || ' of node ' || n, ', ' ORDER BY c.name, n) FROM sharded_seq.counter_config c, generate_series(1, 2) n}));
is(apply_errors('n1', $log1) . apply_errors('n2', $log2), '', 'no error or conflict in either server log');
note('RESULT claims: ' . q1('n1', 'app', q{SELECT string_agg(node_id || '=' || system_identifier, ' ' ORDER BY node_id) FROM sharded_seq.node_claims}));

###########################################################################
note('a grant and a revoke made on node 1 reach a session on node 2 that cached the counter');
q1($_, 'app', 'CREATE ROLE app_user LOGIN') for qw(n1 n2);
my $acl = q{SELECT coalesce(acl::text ~ 'app_user', false) FROM sharded_seq.counter_config WHERE name = 'orders_count'};
q1('n1', 'app', q{SELECT sharded_seq.grant_counter('orders_count', 'app_user', 'update')});
ok($n2->poll_query_until('app', $acl, 't'), 'the grant reaches node 2');
my $u2 = $n2->background_psql('app', on_error_stop => 0, extra_params => [ '-U', 'app_user' ]);
$u2->query_safe('\set VERBOSITY verbose');
is($u2->query_safe(q{SELECT counter_incr('orders_count', 0) >= 0}), 't', 'app_user on node 2 may increment');
q1('n1', 'app', q{SELECT sharded_seq.revoke_counter('orders_count', 'app_user', 'update')});
ok($n2->poll_query_until('app', $acl, 'f'), 'the revoke reaches node 2');
my ($out, $err) = bg_query($u2, q{SELECT 'after', counter_incr('orders_count', 0)});
$u2->quit;
is($out, '', 'the session on node 2 that had cached the counter increments no more');
like($err, qr/ERROR:  42501:/, '... refused with 42501: a revoke replicated from node 1 applies at once');

###########################################################################
note('a third server with node id 1, which node 1 holds, joins the group');
$n3->start;
# the sequence first, as node 0: drawing as node 1 before the claims arrive
# would make this server claim node 1 too, and the claims' copy would fail
ssq_db($n3, 'app');
q1('n3', 'app', $orders . q{SELECT sharded_seq.create_sequence('orders_id')});
set_node_id('n3', 1);
# origin = none with copy_data warns that node 1's tables hold node 2's rows:
# they are meant to come along
q1('n3', 'app',
	"CREATE SUBSCRIPTION app_n3_from_n1 CONNECTION '" . $n1->connstr . " dbname=app"
	  . "' PUBLICATION grp WITH (origin = none, copy_data = true)");
ok( $n3->poll_query_until('app',
		q{SELECT count(*) FILTER (WHERE srsubstate <> 'r') || ' ' || count(*) FROM pg_subscription_rel}, '0 4'),
	'every table of the third server\'s subscription is ready');
is(q1('n3', 'app', 'SELECT count(*) FROM sharded_seq.node_claims'), '2', 'the claims reach the third server');
is(q1('n3', 'app', 'SELECT count(*) FROM orders'), $expected, 'the orders reach the third server');
my ($sys1, $sys3) = map { q1($_, 'app', 'SELECT system_identifier FROM pg_control_system()') } qw(n1 n3);
for my $stmt ("SELECT sharded_nextval('orders_id')", "SELECT counter_incr('orders_count')",
	'INSERT INTO orders (node, session, k, j) VALUES (3, 1, 1, 1)')
{
	my ($rc, $o, $e) = $n3->psql('app', $stmt, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($e,
		qr/ERROR:  55000: sharded_seq\.node_id 1 is claimed by system $sys1, database "app", not by this one \(system $sys3, database "app"\)/,
		"the third node refuses '$stmt' with 55000, naming both claims");
	note('RESULT third node, ' . $stmt . ': ' . ($e =~ /(ERROR.*)$/m)[0]);
}
is(q1('n3', 'app', 'SELECT count(*) FROM sharded_seq.node_claims WHERE node_id = 1'), '1',
	'the third node recorded no claim of its own');
is(q1('n3', 'app', 'SELECT count(*) FROM orders'), $expected, 'the refused insert left no row');
is(q1('n3', 'app', 'SELECT coalesce(sum(apply_error_count + sync_error_count), 0) FROM pg_stat_subscription_stats'),
	'0', 'the third node\'s subscription had no error');
$n3->stop;

###########################################################################
note('without node ids (node 0 on both servers), the same group collides');
set_node_id($_, undef) for qw(n1 n2);
($log1, $log2) = (-s $n1->logfile, -s $n2->logfile);
group_setup('zero', 'n1', 'n2');
# sessions go on after an error: each failed transaction is one collision
run_load('zero', 0, 100, 'n1', 'n2');
# an apply worker's error reaches the log as it stops: wait for a collision
# to show in a log, in a session or in an apply worker
# (PostgreSQL 18's apply worker reports it as a conflict, insert_exists)
my $dup = qr/duplicate key value violates unique constraint "orders_pkey"|conflict detected on relation "public\.orders": conflict=insert_exists/;
my ($in_apply, $in_sessions) = (0, 0);
$t0 = time;
while (time - $t0 < $PostgreSQL::Test::Utils::timeout_default)
{
	my @e = split /^/, apply_errors('n1', $log1) . apply_errors('n2', $log2);
	$in_apply = grep { /logical replication/ && /$dup/ } @e;
	$in_sessions = grep { /client backend/ && /$dup/ } @e;
	last if $in_apply + $in_sessions;
	usleep(200_000);
}
note("RESULT node 0 on both: the same ids drawn on both servers; $in_sessions transactions failed on an id the other server had used, $in_apply apply workers stopped on one; rows "
	  . q1('n1', 'zero', 'SELECT count(*) FROM orders') . ' and ' . q1('n2', 'zero', 'SELECT count(*) FROM orders'));
cmp_ok($in_apply + $in_sessions, '>', 0, 'without node ids the servers draw the same ids: they collide');
q1('n1', 'zero', 'ALTER SUBSCRIPTION zero_n1_from_n2 DISABLE');
q1('n2', 'zero', 'ALTER SUBSCRIPTION zero_n2_from_n1 DISABLE');

done_testing();

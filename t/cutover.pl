# S1 and C1/C2 across a cutover from a logical-replication publisher to its
# subscriber (issue 22), 15 -> 15 (test/cross_major/cutover_15_to_17.sh
# crosses majors).  Publisher preloaded: sequences orders_id (node cache)
# and tickets_id (cache 'session'), a table orders drawing both by DEFAULT,
# counters orders_exact and orders_buf (buffered), 2,000 rows preloaded, a
# publication FOR ALL TABLES.  Subscriber: the schema from pg_dump -s and a
# subscription.  Writers on the publisher insert orders and increment both
# counters, every fifth transaction rolled back, and print every id they are
# handed (the record outside the database).  Before the call, the subscriber
# refuses to draw (55000, naming sharded_seq.cutover()); then
# sharded_seq.cutover('s') on the subscriber while the writers still run:
# the publisher refuses from then on, the subscriber has every committed
# row, counters equal on both sides and to the rows, and, once the
# subscription is dropped, writers on the subscriber get no id the publisher
# handed out (committed or not) and none twice.  Last, cutover_resume()
# undoes the stop on the old primary.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

my $conf = qq{
max_worker_processes = 16
max_logical_replication_workers = 8
};
my $pub = ssq_node('pub', preload => 1, allows_streaming => 'logical', conf => $conf, db => 'app');
my $sub = ssq_node('sub', preload => 1, allows_streaming => 'logical', conf => $conf, start => 0);
$sub->start;
my ($sessions, $txns) = (4, 20000);

$pub->safe_psql('app', q{
SELECT sharded_seq.create_sequence('orders_id', block => 50);
SELECT sharded_seq.create_sequence('tickets_id', block => 20, cache => 'session');
CREATE TABLE orders (
    id     bigint PRIMARY KEY DEFAULT sharded_nextval('orders_id'),
    ticket bigint UNIQUE NOT NULL DEFAULT sharded_nextval('tickets_id'),
    w      integer NOT NULL
);
SELECT sharded_seq.create_counter('orders_exact');
SELECT sharded_seq.create_counter('orders_buf', mode => 'buffered');
INSERT INTO orders (w) SELECT 0 FROM generate_series(1, 2000);
SELECT counter_incr('orders_exact', 2000), counter_incr('orders_buf', 2000);
CREATE PUBLICATION p FOR ALL TABLES;
});

# the subscriber: the schema as pg_dump -s has it, and a subscription
my $schema = $PostgreSQL::Test::Utils::tmp_check . '/schema.sql';
$pub->command_ok([ 'pg_dump', '-s', '-d', $pub->connstr('app'), '-f', $schema ], 'pg_dump -s of the publisher');
$sub->safe_psql('postgres', 'CREATE DATABASE app');
$sub->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $sub->connstr('app'), '-f', $schema ],
	'the schema on the subscriber');
$sub->safe_psql('app', "CREATE SUBSCRIPTION s CONNECTION '" . $pub->connstr . " dbname=app' PUBLICATION p");
$sub->poll_query_until('app',
	"SELECT count(*) = 0 FROM pg_subscription_rel WHERE srsubstate NOT IN ('r', 's')")
  or die 'the subscription did not synchronize';
$sub->poll_query_until('app', 'SELECT count(*) = 2000 FROM orders') or die 'rows did not arrive';

# writers on the publisher, left running until the test stops them (after
# each was refused by the cutover); each prints every id it is handed
my @scripts;
for my $s (1 .. $sessions)
{
	my $sql = '';
	for my $k (1 .. $txns)
	{
		$sql .= stop_point('writers') if $k % 10 == 1;
		my $end = $k % 5 == 0 ? 'ROLLBACK' : 'COMMIT';
		my $tag = $k % 5 == 0 ? 'rb' : 'c';
		$sql .= "BEGIN;\nINSERT INTO orders (w) VALUES ($s) RETURNING '$tag ' || id || ' ' || ticket;\n"
		  . "SELECT 'n', counter_incr('orders_exact'), counter_incr('orders_buf');\n$end;\n";
	}
	push @scripts, $sql;
}
my $load = load_start($pub, 'app', 'writers', @scripts);
load_progress($load, 200);

# the skipped call: the subscriber refuses to draw, naming the call
for my $seq (qw(orders_id tickets_id))
{
	my ($ret, $out, $err) = $sub->psql('app', "\\set VERBOSITY verbose\nSELECT sharded_nextval('$seq')");
	like($err, qr/ERROR:  55000: sharded sequence "$seq" arrived by logical replication/,
		"before the call, the subscriber refuses to draw from $seq");
	like($err, qr/HINT:  .*SELECT sharded_seq\.cutover\('subscription_name'\)/, "and the hint names the call ($seq)");
}
my ($ret, $out, $err) = $sub->psql('app', 'INSERT INTO orders (w) VALUES (-1)');
like($err, qr/arrived by logical replication/, 'an insert with the DEFAULT on the subscriber is refused, not a duplicate key');
is($sub->safe_psql('app', "SELECT string_agg(name || '=' || positions_unknown, ',' ORDER BY name) FROM sharded_seq.sequences"),
	'orders_id=true,tickets_id=true', 'the sequences view shows both as positions_unknown');

# bad input
($ret, $out, $err) = $sub->psql('app', "\\set VERBOSITY verbose\nSELECT * FROM sharded_seq.cutover(NULL)");
like($err, qr/ERROR:  22004: subscription must not be null/, 'cutover(NULL): 22004');
($ret, $out, $err) = $sub->psql('app', "\\set VERBOSITY verbose\nSELECT * FROM sharded_seq.cutover('nosuch')");
like($err, qr/ERROR:  42704: subscription "nosuch" does not exist.*\n.*HINT:  .*before DROP SUBSCRIPTION/s, 'an unknown subscription: 42704 with a hint');

# the call, while the writers run
my $result = $sub->safe_psql('app',
	"SELECT sequence_name, old_high_water, new_start, new_start > old_high_water FROM sharded_seq.cutover('s')");
note "cutover:\n$result";
like($result, qr/^orders_id\|\d+\|\d+\|t\ntickets_id\|\d+\|\d+\|t$/, 'cutover() starts every sequence above the old high water');
is($sub->safe_psql('app', "SELECT count(*) FROM sharded_seq.sequences WHERE positions_unknown"), '0',
	'... and clears positions_unknown');

# the old primary refuses from now on (draws, increments, layout changes)
($ret, $out, $err) = $pub->psql('app', "SELECT sharded_nextval('orders_id')");
like($err, qr/stopped by a cutover/, 'the old primary refuses to draw');
($ret, $out, $err) = $pub->psql('app', "SELECT counter_incr('orders_exact')");
like($err, qr/stopped by a cutover/, 'the old primary refuses increments');
($ret, $out, $err) = $pub->psql('app', "SELECT sharded_seq.alter_sequence('orders_id', block => 60)");
like($err, qr/stopped by a cutover/, 'the old primary refuses layout changes, which would replicate');
# every writer runs on into the stop, then the test stops them
poll_until(
	sub {
		for my $s (@$load)
		{
			open my $fh, '<', "$s->{file}.err" or return 0;
			local $/;
			my $err = <$fh>;
			return 0 unless $err =~ /stopped by a cutover/;
		}
		return 1;
	},
	'every writer refused by the cutover');
stop_load($pub, 'app', 'writers');
my ($outs, $errs) = load_finish($load);
my $refused = grep { /stopped by a cutover/ } @$errs;
ok($refused > 0, "writers still running were refused ($refused sessions)");

# everything the old primary committed is on the subscriber
my $pub_rows = $pub->safe_psql('app', 'SELECT count(*), sum(id), sum(ticket) FROM orders');
is($sub->safe_psql('app', 'SELECT count(*), sum(id), sum(ticket) FROM orders'), $pub_rows,
	'the subscriber has every committed row');
my ($committed) = split /\|/, $pub_rows;
for my $c (qw(orders_exact orders_buf))
{
	is($sub->safe_psql('app', "SELECT counter_value('$c')"), $committed, "$c on the subscriber equals the rows");
	is($pub->safe_psql('app', "SELECT counter_value('$c')"), $committed, "$c on the old primary equals the rows");
}
is($sub->safe_psql('app', "SELECT count(*) FROM sharded_seq.cutover('s', timeout => '1 min')"), 2,
	'cutover() may be called again');

# a change the old primary makes after the call reaches a session that
# cached the configuration (E1): refused, and the local generation is kept,
# so the next call starts above what this server drew too
my $bg = $sub->background_psql('app', on_error_stop => 0);
my ($v1) = bg_query($bg, "SELECT sharded_nextval('orders_id')");
like($v1, qr/^\d+$/, 'after the call the subscriber draws');
my $gen = $sub->safe_psql('app', "SELECT generation FROM sharded_seq.sequence_config WHERE name = 'orders_id'");
$pub->safe_psql('app',
	"SELECT sharded_seq.cutover_resume(); UPDATE sharded_seq.sequence_config SET altered_at = now() WHERE name = 'orders_id'");
$sub->poll_query_until('app', "SELECT positions_unknown FROM sharded_seq.sequence_config WHERE name = 'orders_id'")
  or die 'the change did not arrive';
my ($o, $e) = bg_query($bg, "SELECT sharded_nextval('orders_id')");
like($e, qr/arrived by logical replication/, 'a session that cached the configuration is refused once a change arrives');
is($sub->safe_psql('app', "SELECT generation FROM sharded_seq.sequence_config WHERE name = 'orders_id'"),
	$gen, 'the replicated change does not take the subscriber back to the old generation');
$sub->safe_psql('app', "SELECT count(*) FROM sharded_seq.cutover('s')");
($o, $e) = bg_query($bg, "SELECT sharded_nextval('orders_id')");
ok($o =~ /^\d+$/ && $o > $v1, "a third call lets it draw again, above its last value ($v1 < $o)") or diag $e;
$bg->quit;
my @extra_ids = ($v1, $o);	# orders_id values drawn by that session
$sub->safe_psql('app', 'DROP SUBSCRIPTION s');

# writers on the new primary
my @new = parallel_psql($sub, 'app',
	map { "INSERT INTO orders (w) SELECT -$_ FROM generate_series(1, 300) RETURNING 'c ' || id || ' ' || ticket; "
		  . "SELECT 'n', counter_incr('orders_exact', 300), counter_incr('orders_buf', 300);" } 1 .. $sessions);

# no id twice: the old primary's (committed or rolled back) and the new one's
for my $col (0, 1)
{
	my (%seen, @dups);
	my $n = 0;
	for my $text (@$outs, @new)
	{
		for my $line (split /\n/, $text)
		{
			next unless $line =~ /^(?:c|rb) (\d+) (\d+)$/;
			my $v = $col ? $2 : $1;
			$n++;
			push @dups, $v if $seen{$v}++;
		}
	}
	for my $v ($col ? () : @extra_ids)
	{
		$n++;
		push @dups, $v if $seen{$v}++;
	}
	my $what = $col ? 'tickets_id' : 'orders_id';
	note "RESULT $what: $n values handed out on both sides";
	is(scalar @dups, 0, "$what: no value handed out twice across the cutover")
	  or diag "first repeated: @dups[0 .. ($#dups < 9 ? $#dups : 9)]";
}
is($sub->safe_psql('app', 'SELECT count(*) FROM orders'), $committed + 300 * $sessions, 'every insert on the new primary committed');
is($sub->safe_psql('app', "SELECT counter_value('orders_exact') = count(*) AND counter_value('orders_buf') = count(*) FROM orders"),
	't', 'counters on the new primary go on from the old totals');

# undoing the stop on the old primary
is($pub->safe_psql('app', 'SELECT sharded_seq.cutover_resume()'), 't', 'cutover_resume() undoes the stop');
$pub->safe_psql('app', "SELECT sharded_nextval('orders_id'), counter_incr('orders_exact')");

done_testing();

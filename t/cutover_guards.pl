# The edges of a cutover across logical replication (issue 22): a
# subscription made under 1.4 (its rows copied before the mark existed),
# then ALTER EXTENSION UPDATE on both sides: the subscriber refuses to draw
# (55000) until sharded_seq.cutover(), and to increment or set a counter
# (its rows would be overwritten by the publisher's); a timeout too long
# for the waits is refused (22023); a cancelled call leaves no session
# waiting on the publisher; after the call, create_sequence and
# create_counter get fresh ids (object_id_seq is carried); and a
# subscription whose publisher has this server's system identifier
# (itself, or a pg_basebackup copy) is refused instead of stopping this
# server; a second cutover down a chain (the new primary's subscriber
# takes over from it) is guarded the same way, although the first one's
# rows replicate to it; maintain() runs on a server that publishes FOR ALL
# TABLES.  t/cutover.pl checks the cutover itself under load.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(usleep);
use Test::More;
use ShardedSeq::Node;

my $pub = ssq_node('pub', allows_streaming => 'logical', start => 0);
my $sub = ssq_node('sub', allows_streaming => 'logical', start => 0);
my ($default, $base, @reached) = install_versions($pub);
plan skip_all => 'the install scripts do not reach 1.4' unless grep { $_ eq '1.4' } @reached;
for my $n ($pub, $sub)
{
	$n->start;
	$n->safe_psql('postgres', 'CREATE DATABASE app');
	$n->safe_psql('app', "CREATE EXTENSION sharded_seq VERSION '1.4'");
}
$pub->safe_psql('app', qq{
SELECT sharded_seq.create_sequence('orders_id', block => 50);
SELECT sharded_seq.create_counter('orders_c');
CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT sharded_nextval('orders_id'), w int);
INSERT INTO orders (w) SELECT 0 FROM generate_series(1, 500);
SELECT counter_incr('orders_c', 500);
CREATE PUBLICATION p FOR ALL TABLES;
});
# the subscriber: the schema as pg_dump -s has it (the shard sequences)
my $schema = $PostgreSQL::Test::Utils::tmp_check . '/schema.sql';
$pub->command_ok([ 'pg_dump', '-s', '-d', $pub->connstr('app'), '-f', $schema ], 'pg_dump -s of the publisher');
$sub->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $sub->connstr('app'), '-f', $schema ],
	'the schema on the subscriber (1.4 stays: IF NOT EXISTS)');
$sub->safe_psql('app', "CREATE SUBSCRIPTION s CONNECTION '" . $pub->connstr . " dbname=app' PUBLICATION p");
my $synced = "SELECT count(*) = 0 FROM pg_subscription_rel WHERE srsubstate NOT IN ('r', 's')";
$sub->poll_query_until('app', $synced) or die 'the subscription did not synchronize';
$sub->poll_query_until('app', 'SELECT count(*) = 500 FROM orders') or die 'rows did not arrive';

# 1. the update on the subscriber marks what the 1.4 subscription copied
$sub->safe_psql('app', 'ALTER EXTENSION sharded_seq UPDATE');
$pub->safe_psql('app', 'ALTER EXTENSION sharded_seq UPDATE');
$sub->safe_psql('app', 'ALTER SUBSCRIPTION s REFRESH PUBLICATION');
$sub->poll_query_until('app', $synced) or die 'the refreshed subscription did not synchronize';
my ($ret, $out, $err) = $sub->psql('app', "\\set VERBOSITY verbose\nSELECT sharded_nextval('orders_id')");
like($err, qr/ERROR:  55000: sharded sequence "orders_id" arrived by logical replication/,
	'after the update, a sequence a 1.4 subscription copied is refused')
  or diag "drawn: $out";
is($pub->safe_psql('app', 'SELECT count(*) FROM sharded_seq.sequences WHERE positions_unknown'), '0',
	'the publisher, which subscribes to nothing, is not marked');

# 3. counters: an increment here would be overwritten by the publisher's rows
for my $call ("counter_incr('orders_c')", "sharded_seq.set_counter('orders_c', 7)")
{
	($ret, $out, $err) = $sub->psql('app', "\\set VERBOSITY verbose\nSELECT $call");
	like($err, qr/ERROR:  55000: counters of this database arrive by logical replication.*\n.*\n.*HINT:  .*sharded_seq\.cutover/s,
		"before the call, the subscriber refuses $call");
}

# 7. a timeout the waits cannot take
($ret, $out, $err) = $sub->psql('app', "\\set VERBOSITY verbose\nSELECT * FROM sharded_seq.cutover('s', '30 days')");
like($err, qr/ERROR:  22023: timeout must be at most 2147483647 milliseconds.*\n.*HINT:  /s,
	'a timeout over 24 days: 22023 with a hint');

# 8. a cancelled call: the publisher's session ends too (it waited for an
# open transaction there)
my $open = $pub->background_psql('app');
$open->query_safe('BEGIN; SELECT 1');
my $load = load_start($sub, 'app', 'cancelled', "SELECT * FROM sharded_seq.cutover('s');\n");
my $waiting = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sharded_seq cutover'";
$pub->poll_query_until('app', "$waiting AND wait_event = 'virtualxid'", 1)
  or die 'cutover_source() did not wait for the open transaction';
$sub->safe_psql('app',
	"SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE '%sharded_seq.cutover(''s'')%' AND pid <> pg_backend_pid()");
my ($outs, $errs) = load_finish($load);
like($errs->[0], qr/canceling statement due to user request/, 'the call is cancelled');
my $gone = 0;
for (1 .. 200)
{
	last if ($gone = $pub->safe_psql('app', $waiting) eq '0');
	usleep(100_000);
}
ok($gone,
	'... and its session on the publisher ends, though the transaction it waited for is still open');
$open->quit;
is($pub->safe_psql('app', 'SELECT sharded_seq.cutover_resume()'), 't', 'the stop it left is undone');

# 1 and 4. the call clears the mark; the object ids are carried
my $max = $sub->safe_psql('app', 'SELECT max(id) FROM orders');
($ret, $out, $err) = $sub->psql('app', "SELECT sequence_name FROM sharded_seq.cutover('s')");
like($out, qr/^orders_id$/, 'cutover() runs');
is($err, '', '... with no warning (every sequence it advanced is cleared)');
is($sub->safe_psql('app', "SELECT counter_incr('orders_c')"), '501',
	'after the call, the subscriber increments on top of the total that arrived');
$sub->safe_psql('app', 'DROP SUBSCRIPTION s');
my $v = $sub->safe_psql('app', "SELECT sharded_nextval('orders_id')");
ok($v > $max, "the subscriber draws above the publisher's values ($v > $max)");
($ret, $out, $err) = $sub->psql('app',
	"SELECT sharded_seq.create_sequence('fresh_id'); SELECT sharded_seq.create_counter('fresh_c')");
is($err, '', 'create_sequence and create_counter on the new primary work') or diag $err;
is($sub->safe_psql('app',
		"SELECT count(DISTINCT id) FROM (SELECT id FROM sharded_seq.sequence_config UNION ALL SELECT id FROM sharded_seq.counter_config) i"),
	'4', '... with ids of their own');

# 2. a subscription whose publisher has this server's system identifier
$sub->safe_psql('app',
	"CREATE SUBSCRIPTION self CONNECTION '" . $sub->connstr . " dbname=app' PUBLICATION p"
	  . " WITH (connect = false, create_slot = false, slot_name = 'self', enabled = false)");
$sub->safe_psql('app', 'ALTER SUBSCRIPTION self ENABLE');
($ret, $out, $err) = $sub->psql('app', "\\set VERBOSITY verbose\nSELECT * FROM sharded_seq.cutover('self', '3 s')");
like($err, qr/ERROR:  55000: the publisher of subscription "self" has this server's system identifier.*\n.*HINT:  /s,
	'a publisher with this system identifier is refused');
is($sub->safe_psql('app',
		'SELECT count(*) FROM sharded_seq.cutover_stops WHERE system_identifier = (SELECT system_identifier::text FROM pg_control_system())'),
	'0', '... and this server is not stopped');
($ret, $out, $err) = $sub->psql('app', "SELECT sharded_nextval('orders_id')");
is($err, '', '... the server still draws');
$sub->safe_psql('app', "ALTER SUBSCRIPTION self DISABLE; ALTER SUBSCRIPTION self SET (slot_name = NONE); DROP SUBSCRIPTION self");

# maintain() on a server that publishes FOR ALL TABLES updates its
# maintenance row (a replica identity: it failed every round before)
$sub->poll_query_until('app', "SELECT bool_and(now() - fold_at >= interval '1 s') FROM sharded_seq.maintenance")
  or die 'the maintenance row did not age';
($ret, $out, $err) = $sub->psql('app', "SET sharded_seq.counter_fold_after = 1; SELECT count(*) >= 0 FROM sharded_seq.maintain()");
is($err, '', 'maintain() runs on a server with a publication FOR ALL TABLES');

# a chain: the new primary's own subscriber (the schema from pg_dump -s of
# it, publication p included) is guarded until its own cutover(), although
# the first cutover's row arrives with the rest
my $third = ssq_node('third', allows_streaming => 'logical', start => 0);
$third->start;
$third->safe_psql('postgres', 'CREATE DATABASE app');
my $schema2 = $PostgreSQL::Test::Utils::tmp_check . '/schema2.sql';
$sub->command_ok([ 'pg_dump', '-s', '-d', $sub->connstr('app'), '-f', $schema2 ], 'pg_dump -s of the new primary');
$third->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $third->connstr('app'), '-f', $schema2 ],
	'the schema on a third server');
$third->safe_psql('app', "CREATE SUBSCRIPTION s2 CONNECTION '" . $sub->connstr . " dbname=app' PUBLICATION p");
$third->poll_query_until('app', $synced) or die 'the third server did not synchronize';
$third->poll_query_until('app', 'SELECT count(*) > 0 FROM sharded_seq.cutover_stops') or die 'no stop row arrived';
($ret, $out, $err) = $third->psql('app', "\\set VERBOSITY verbose\nSELECT counter_incr('orders_c', 1000)");
like($err, qr/ERROR:  55000: counters of this database arrive by logical replication/,
	'down a chain, the next subscriber refuses an increment before its own cutover()');
my $total = $sub->safe_psql('app', "SELECT counter_value('orders_c')");
($ret, $out, $err) = $third->psql('app', "SELECT sequence_name FROM sharded_seq.cutover('s2')");
is($err, '', 'its cutover() runs');
is($third->safe_psql('app', "SELECT counter_incr('orders_c')"), $total + 1, '... and then it counts on top of the total that arrived');

done_testing();

# Node ids on one server started with sharded_seq.node_id = 5, preloaded,
# with memcached (S1 and S5 in a node's range, C3 rows per node, the claim):
# values in node 5's range (both tiers, up to S5's error at the range's end),
# object ids 5 + 1024k, counter rows 5 * 1024 + s written (commits, growth on
# a node that has none yet, alter_counter, maintain(), both write-behind
# flushes) while every node's rows count in totals, counter_incr refusing to
# create, another system's claim refused with both claims named (in new
# sessions and in one that had checked its claim), a reload that changes the
# id for new sessions only, and an update of this server's own claim in
# progress that refuses nothing.  Session m is the test's main session;
# a, b, c and u are other backends, started when the test says.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;
use ShardedSeq::Memcached;

my $mc = ShardedSeq::Memcached->new;
my $node = ssq_node(
	'nodes',
	preload => 1,
	db => 'nodes',
	conf => "sharded_seq.memcached_servers = '" . $mc->servers . "'\nsharded_seq.node_id = 5\n");
my ($lo, $hi) = ('45035996273704960', '54043195528445951');
my $sysid = $node->safe_psql('nodes', 'SELECT system_identifier FROM pg_control_system()');

# a session whose errors show their SQLSTATE
sub session
{
	my $h = $node->background_psql('nodes', on_error_stop => 0);
	$h->query_safe('\set VERBOSITY verbose');
	return $h;
}
my $m = session();
sub ms { return $m->query_safe($_[0]); }

# fails(SESSION, SQL, SQLSTATE, MESSAGE_RE, NAME): SQL fails there so
sub fails
{
	my ($h, $sql, $state, $re, $name) = @_;
	my ($out, $err) = bg_query($h, $sql);
	like($err, qr/ERROR:  $state: $re/, $name);
	return;
}

is(ms('SELECT sharded_seq.node_id()'), '5', 'the session is node 5');

note('sequences: values in node 5\'s range');
ms("SELECT sharded_seq.create_sequence('s', shards => 4, block => 10)");
is( ms("SELECT node_id || ' ' || system_identifier || ' ' || database FROM sharded_seq.node_claims"),
	"5 $sysid nodes", 'the first use claims node 5 for this system and database');
is(ms("SELECT id % 1024 FROM sharded_seq.sequence_config WHERE name = 's'"), '5', 'a new object id is 5 + 1024k');
ms(q{CREATE FUNCTION pg_temp.increasing(a bigint[]) RETURNS boolean LANGUAGE sql AS $$
    SELECT coalesce(bool_and(a[i] > a[i - 1]), true) FROM generate_series(2, cardinality(a)) i $$});
ms("CREATE TEMP TABLE drawn AS SELECT g, sharded_nextval('s') AS v FROM generate_series(1, 100) g");
is(ms("SELECT bool_and(v BETWEEN $lo AND $hi) FROM drawn"), 't', 'every value lies in 5 * 2^53 .. 6 * 2^53 - 1');
is(ms('SELECT pg_temp.increasing((SELECT array_agg(v ORDER BY g) FROM drawn))'), 't', '... and they strictly increase');
is(ms("SELECT sharded_currval('s') = (SELECT v FROM drawn WHERE g = 100)"), 't',
	'sharded_currval is the last value, in the node\'s range');
is( ms("SELECT generation_start = $lo AND reserved_high_water BETWEEN (SELECT max(v) FROM drawn) AND $hi
              AND node_id = 5 FROM sharded_seq.sequences WHERE name = 's'"),
	't', 'the sequences view shows positions as node 5\'s values');
# another session draws from node 5's range too, and never a value of ours
my $a = session();
my $theirs = join ',', split /\n/, $a->query_safe("SELECT sharded_nextval('s') FROM generate_series(1, 50)");
is( ms("SELECT bool_and(v BETWEEN $lo AND $hi) AND count(*) = 50 AND NOT bool_or(v IN (SELECT v FROM drawn))
         FROM unnest('{$theirs}'::bigint[]) v"),
	't', 'another session\'s values: node 5\'s range, none of ours');
ms("SELECT sharded_seq.alter_sequence('s', shards => 2, block => 7)");
is(ms("SELECT sharded_nextval('s') > (SELECT max(v) FROM drawn)"), 't',
	'after alter_sequence, the session\'s values still increase');
ms("SELECT sharded_seq.advance_sequence('s', $lo + 1000000)");
is(ms("SELECT sharded_nextval('s') > $lo + 1000000"), 't',
	'advance_sequence(past) in the node\'s range: later values are above past');
ms("SELECT sharded_seq.advance_sequence('s', 17)");
is(ms("SELECT sharded_nextval('s') BETWEEN $lo + 1000000 AND $hi"), 't',
	'a past below the range changes nothing that matters: never backwards');
fails($m, "SELECT sharded_seq.advance_sequence('s', $hi)", '22003', '',
	'advance_sequence past the top of the node\'s range is refused');
fails($m, "SELECT sharded_seq.create_sequence('far', start => $hi + 1)", '22003', '',
	'create_sequence with a start beyond the range is refused');
ms("SELECT sharded_seq.create_sequence('low', shards => 1, start => 12)");
is(ms("SELECT sharded_nextval('low')"), $lo, 'a start below the range: values begin at the bottom of the range');
# the top of the range: S5's error names the node's range
ms("SELECT sharded_seq.create_sequence('edge', shards => 1, block => 1, start => $hi - 1)");
is(ms("SELECT sharded_nextval('edge')"), $hi - 1, 'the last values of the range are handed out ...');
is(ms("SELECT sharded_nextval('edge')"), $hi, '... up to 6 * 2^53 - 1');
fails($m, "SELECT sharded_nextval('edge')", '2200H',
	qr/sharded sequence "edge" has reached the end of node 5's range\n/,
	'then 2200H, naming the node\'s range');
fails($m, "SELECT sharded_nextval('edge')", '2200H', '', '... and again: nothing wraps');
# the memcached tier: leases are local positions too
ms("SELECT sharded_seq.create_sequence('m', tier => 'memcached', block => 100)");
ms("CREATE TEMP TABLE mdrawn AS SELECT g, sharded_nextval('m') AS v FROM generate_series(1, 300) g");
is( ms("SELECT (SELECT bool_and(v BETWEEN $lo AND $hi) FROM mdrawn)
              AND pg_temp.increasing((SELECT array_agg(v ORDER BY g) FROM mdrawn))"),
	't', 'memcached tier: values in the node\'s range, increasing');
is(ms("SELECT hits > 0 FROM sharded_seq.memcached_stats WHERE name = 'm'"), 't', '... served by memcached');

note('counters: this node\'s rows only; totals over every node\'s');
sub rows_of
{
	return ms("SELECT string_agg(shard || ':' || value, ' ' ORDER BY shard) FROM sharded_seq.counter_shards
	           WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = '$_[0]')");
}
ms("SELECT sharded_seq.create_counter('c'); SELECT counter_incr('c', 3)");
is(ms("SELECT id % 1024 FROM sharded_seq.counter_config WHERE name = 'c'"), '5', 'a counter id is 5 + 1024k');
is(rows_of('c'), '5120:3', 'a new counter\'s row is node 5\'s first: 5 * 1024');
# rows of node 7, as replication would bring them
ms(q{INSERT INTO sharded_seq.counter_shards
SELECT id, s, v FROM sharded_seq.counter_config, (VALUES (7168, 100), (7169, 20)) r(s, v) WHERE name = 'c'});
is(ms("SELECT counter_value('c')"), '123', 'counter_value sums every node\'s rows');
is(ms("SELECT counter_incr('c', 1)"), '124', 'counter_incr returns the total over every node\'s rows');
is(ms("SELECT total FROM sharded_seq.counters WHERE name = 'c'"), '124', '... and so does the counters view');
is(rows_of('c'), '5120:4 7168:100 7169:20', 'a commit writes only node 5\'s rows');
ms("SELECT sharded_seq.alter_counter('c', shards => 3)");
is(rows_of('c'), '5120:4 5121:0 5122:0 7168:100 7169:20',
	'alter_counter lays out node 5\'s rows and keeps node 7\'s untouched');
is(ms("SELECT counter_value('c')"), '124', '... and the total');
# a pinned counter: its fast read must not miss rows that other nodes add
ms("SELECT sharded_seq.create_counter('p', shards => 2); SELECT counter_incr('p', 5)");
is(ms("SELECT counter_value('p')"), '5', 'a pinned counter, read once');
ms("INSERT INTO sharded_seq.counter_shards SELECT id, 7168, 40 FROM sharded_seq.counter_config WHERE name = 'p'");
is(ms("SELECT counter_value('p')"), '45', '... sees a row another node added afterwards');
# a counter created elsewhere (only node 7's rows): the first commit here adds node 5's
ms(q{INSERT INTO sharded_seq.counter_config (id, name, shards, mode, owner) VALUES (7 + 1024 * 900, 'from7', 2, 'exact', 'postgres');
INSERT INTO sharded_seq.counter_shards VALUES (7 + 1024 * 900, 7168, 9), (7 + 1024 * 900, 7169, 1);
SELECT counter_incr('from7', 2)});
is( ms('SELECT string_agg(shard::text, \' \' ORDER BY shard) FROM sharded_seq.counter_shards WHERE counter_id = 7 + 1024 * 900'),
	'5120 5121 7168 7169', 'a counter created on another node gets node 5\'s rows at its first commit here');
is(ms("SELECT counter_value('from7')"), '12', '... and its total is exact');
# maintain(): folds node 5's idle rows, never node 7's; passes until the
# rows have been idle for counter_fold_after
ms(q{CREATE FUNCTION fold_a() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	PERFORM set_config('sharded_seq.counter_fold_after', '1', true);
	PERFORM sharded_seq.maintain();
	RETURN (SELECT count(*) FROM sharded_seq.counter_shards WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = 'a') AND shard / 1024 = 5) = 1;
END $$});
ms(q{SELECT sharded_seq.create_counter('a');
INSERT INTO sharded_seq.counter_shards
SELECT id, s, 1 FROM sharded_seq.counter_config, (VALUES (5121), (5122), (7168), (7169)) r(s) WHERE name = 'a';
UPDATE sharded_seq.maintenance SET fold_at = now() - interval '1 hour'});
ok($node->poll_query_until('nodes', 'SELECT fold_a()'), 'maintain() folds a');
is(rows_of('a'), '5120:2 7168:1 7169:1', 'maintain() folds node 5\'s idle rows and leaves node 7\'s');
# write-behind modes flush into node 5's rows
ms(q{SELECT sharded_seq.create_counter('buf', mode => 'buffered');
SELECT sharded_seq.create_counter('mc', mode => 'memcached');
SELECT counter_incr('buf', 6), counter_incr('mc', 8);
SELECT sharded_seq.flush_counters()});
is( ms(q{SELECT string_agg(c.name || ':' || s.shard / 1024 || ':' || s.value, ' ' ORDER BY c.name, s.shard)
         FROM sharded_seq.counter_shards s JOIN sharded_seq.counter_config c ON c.id = s.counter_id
        WHERE c.name IN ('buf', 'mc') AND s.value <> 0}),
	'buf:5:6 mc:5:8', 'flushes of both write-behind modes land in node 5\'s rows');
# counter_incr does not create counters on a node
fails($m, "SELECT counter_incr('nobody_made_me')", '42704', 'counter "nobody_made_me" does not exist',
	'counter_incr refuses to create a counter on a node');
is(ms("SELECT count(*) FROM sharded_seq.counter_config WHERE name = 'nobody_made_me'"), '0', '... and creates nothing');

note('the claim: another system\'s claim of node 5 stops new sessions');
is(ms('SELECT string_agg(t::text, \' \' ORDER BY 1) FROM sharded_seq.replicated_tables() t'),
	'sharded_seq.counter_config sharded_seq.counter_shards sharded_seq.node_claims',
	'replicated_tables(): exactly the counters and the claims');
ms("UPDATE sharded_seq.node_claims SET system_identifier = '4242', database = 'elsewhere' WHERE node_id = 5");
my $b = session();
fails($b, "SELECT sharded_nextval('s')", '55000',
	qr/sharded_seq\.node_id 5 is claimed by system 4242, database "elsewhere", not by this one \(system $sysid, database "nodes"\)\n/,
	'a new session refuses sharded_nextval, naming both claims (55000)');
fails($b, "SELECT counter_incr('c')", '55000', 'sharded_seq.node_id 5 is claimed by system 4242', '... and counter_incr');
fails($b, "SELECT sharded_seq.create_counter('c2')", '55000', '', '... and creating a counter');
fails($b, 'SELECT (sharded_seq.maintain()).folded', '55000', '', '... and maintain()');
is($b->query_safe("SELECT counter_value('c')"), '124', 'reads still work');
fails($m, "SELECT sharded_nextval('s')", '55000', '.*claimed by system 4242',
	'a session that had checked its claim is refused too, once another system holds it');
# the stale claim deleted: the refused session claims node 5 again at its next call
ms('DELETE FROM sharded_seq.node_claims WHERE node_id = 5');
is($b->query_safe("SELECT sharded_nextval('s') BETWEEN $lo AND $hi"), 't', 'once the stale claim is gone, the session draws');
is(ms('SELECT system_identifier FROM sharded_seq.node_claims WHERE node_id = 5'), $sysid, '... having claimed node 5 again');

note('changing node_id: new sessions take the new node\'s range');
my $before_change = ms("SELECT max(v) FROM (SELECT v FROM drawn UNION ALL SELECT sharded_nextval('s')) d");
$node->safe_psql('nodes', 'ALTER SYSTEM SET sharded_seq.node_id = 6; SELECT pg_reload_conf()');
$node->poll_query_until('nodes', "SELECT current_setting('sharded_seq.node_id') = '6'") or die 'no reload';
my $c = session();
is($c->query_safe('SELECT sharded_seq.node_id()'), '6', 'a session started after the reload is node 6');
is($c->query_safe("SELECT sharded_nextval('s') BETWEEN $hi + 1 AND $hi + 9007199254740992"), 't',
	'... and draws from node 6\'s range');
is(ms('SELECT string_agg(node_id::text, \' \' ORDER BY node_id) FROM sharded_seq.node_claims'), '5 6',
	'node 6 is claimed too, and node 5\'s claim stays this system\'s');
is(ms('SELECT sharded_seq.node_id()'), '5', 'a session started before keeps node 5 ...');
is(ms("SELECT sharded_nextval('s') > $before_change"), 't', '... and its values keep increasing in node 5\'s range');
is($a->query_safe('SELECT sharded_seq.node_id()'), '5', '... as does every session started before the reload');
$node->safe_psql('nodes', 'ALTER SYSTEM RESET sharded_seq.node_id; SELECT pg_reload_conf()');
$node->poll_query_until('nodes', "SELECT current_setting('sharded_seq.node_id') = '5'") or die 'no reload';
$_->quit for ($a, $b, $c);

# An UPDATE of this server's own claim, still in progress: the dirty
# snapshot shows both versions of the row, which are one claim, not two
# (a first version of 1.4 refused every draw meanwhile).
ms("SELECT sharded_seq.create_sequence('claim_upd'), sharded_seq.create_counter('claim_upd_c'); SELECT sharded_nextval('claim_upd')");
my $u = session();
$u->query_safe("BEGIN; UPDATE sharded_seq.node_claims SET claimed_at = claimed_at + interval '1 second' WHERE node_id = 5");
my ($rc, $out, $err) = $node->psql('nodes', "SELECT sharded_nextval('claim_upd') > 0, counter_incr('claim_upd_c') > 0");
note("RESULT a draw and an increment while this server's claim is being updated: $out (want t|t)");
is($out, 't|t', 'an update of this server\'s own claim in progress refuses no draw or increment');
$u->query_safe('ROLLBACK');
$u->quit;
$m->quit;
# stopped here: Memcached.pm's END would leave its waitpid status as the exit code
$mc->kill;

done_testing();

# E4 across ALTER EXTENSION ... UPDATE, from every earlier version: for every
# version X below the control file's default_version that the installed
# scripts provide (the base sharded_seq--X.sql and each version its update
# chain reaches), install version X, use sequences (database and memcached
# tier) and counters (exact and write-behind) from several sessions, with a
# real memcached, then ALTER EXTENSION sharded_seq UPDATE.  Every counter
# total must be kept, no value may repeat, every later value must be above
# every value its shard handed out before (for one shard: above every earlier
# value), the extension must be at default_version, and the counters go on
# counting, old ones in their layout, new ones adaptive, maintain() included.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;
use ShardedSeq::Memcached;

my $mc = ShardedSeq::Memcached->new;
my $node = ssq_node('main', db => 'postgres', start => 0);
$node->append_conf('postgresql.conf',
	"sharded_seq.memcached_servers = '" . $mc->servers . "'\nsharded_seq.counter_flush_interval = 1\n");
$node->start;

# the versions the installed scripts provide: the base and its update chain
my ($default, $base, @reached) = install_versions($node);
ok((grep { $_ eq $default } @reached), "the install scripts reach default_version $default");
my @older = grep { $_ ne $default } @reached;
plan skip_all => "no version older than $default: nothing to update from" unless @older;
note("RESULT default_version $default; updating from: @older");

my $sessions = 4;
# session i adds i to each counter 25 times (committed), and 1000 in a
# rolled-back transaction, which must not count
sub increments
{
	my ($db) = @_;
	parallel_psql($node, $db,
		map {
			[
				"SELECT counter_incr('exact_c', $_), counter_incr('buf_c', $_) FROM generate_series(1, 25)",
				'BEGIN',
				"SELECT counter_incr('exact_c', 1000), counter_incr('buf_c', 1000)",
				'ROLLBACK'
			]
		} 1 .. $sessions);
	return;
}
sub totals
{
	return $node->safe_psql($_[0],
		"SELECT string_agg(name || '=' || counter_value(name), ' ' ORDER BY name) FROM sharded_seq.counters");
}
# each round adds 25 * (1 + 2 + 3 + 4) = 250 to each counter
sub want { my $t = 25 * $sessions * ($sessions + 1) / 2 * $_[0]; return "buf_c=$t exact_c=$t"; }

for my $v (@older)
{
	my $db = 'upd_' . ($v =~ s/[^a-zA-Z0-9]/_/gr);
	# memcached write-behind: 'buffered' up to 1.2, 'memcached' from 1.3
	# (whose 'buffered' is shared memory and needs a preloaded library)
	my $wb_mode = ($v eq '1.0' || $v eq '1.1' || $v eq '1.2') ? 'buffered' : 'memcached';
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, qq{
CREATE EXTENSION sharded_seq VERSION '$v';
SELECT sharded_seq.create_sequence('db_seq', shards => 4, block => 20);
SELECT sharded_seq.create_sequence('db1_seq', shards => 1, block => 20);
SELECT sharded_seq.create_sequence('mc_seq', tier => 'memcached', block => 400);
SELECT sharded_seq.create_counter('exact_c', shards => 4);
SELECT sharded_seq.create_counter('buf_c', shards => 2, mode => '$wb_mode');
CREATE TABLE drawn (seq text, v bigint, phase text);
});
	is($node->safe_psql($db, "SELECT extversion FROM pg_extension WHERE extname = 'sharded_seq'"),
		$v, "$v installed");
	draw_sessions($node, $db, 'before', $sessions, qw(db_seq db1_seq mc_seq));
	increments($db);
	my $before = totals($db);
	is($before, want(1), "$v: totals before the update");

	$node->safe_psql($db, 'ALTER EXTENSION sharded_seq UPDATE');
	is($node->safe_psql($db, "SELECT extversion FROM pg_extension WHERE extname = 'sharded_seq'"),
		$default, "$v updated to $default");
	is(totals($db), $before, "$v: totals kept across the update");
	# 1.0-1.2's 'buffered' was the memcached write-behind: it keeps that meaning
	is( $node->safe_psql($db,
			"SELECT string_agg(name || ':' || mode, ' ' ORDER BY name) FROM sharded_seq.counters"),
		'buf_c:memcached exact_c:exact', "$v: modes after the update");

	# later values: none repeated, each above every earlier value of its shard
	draw_sessions($node, $db, 'after', $sessions, qw(db_seq db1_seq mc_seq));
	my $check = check_drawn($node, $db);
	note("RESULT $v values: $check");
	like($check, qr/ OK$/, "$v: no value repeated, later values above earlier ones of their shard");
	is($node->safe_psql($db, 'SELECT count(DISTINCT seq) FROM drawn'), '3', "$v: all three sequences drawn");

	# counters keep counting from the kept totals
	increments($db);
	is(totals($db), want(2), "$v: totals after more increments");

	# counters from before keep their layout; new ones are adaptive, and
	# maintain() works on the updated schema without changing a total
	$node->safe_psql($db, "SELECT counter_incr('new_c')");
	is( $node->safe_psql($db,
			"SELECT string_agg(name || ':' || shards || ':' || adaptive, ' ' ORDER BY name) FROM sharded_seq.counters"),
		'buf_c:2:false exact_c:4:false new_c:1:true', "$v: layouts after the update");
	$node->safe_psql($db, 'SELECT sharded_seq.maintain()');
	is(totals($db), want(2) . ' new_c=1', "$v: totals unchanged by maintain()");
}

done_testing();

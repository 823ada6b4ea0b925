# The memcached fast path under faults: S1 and S2 for a memcached-tier
# sequence across flush_all, SIGKILL, a restart and an outage, and C2 for a
# memcached counter (nothing counted twice, no error for the caller, exact
# after a clean flush).  8 sessions draw and increment (each committed delta
# also goes to a ledger in the same transaction) while memcached is flushed,
# killed, restarted empty and taken down; each fault waits until the load has
# shown it noticed the one before.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;
use ShardedSeq::Memcached;

my $mc = ShardedSeq::Memcached->new;
my $node = ssq_node(
	'main',
	preload => 1,
	conf => "sharded_seq.memcached_servers = '" . $mc->servers . "'\n"
	  . "sharded_seq.counter_flush_interval = 1\n");
my $db = 'stress';
sub sql { return $node->safe_psql($db, $_[0]); }
sql(q{
SELECT sharded_seq.create_sequence('ms', tier => 'memcached', block => 500);
SELECT sharded_seq.create_counter('bc', shards => 4, mode => 'memcached');
CREATE TABLE ledger (counter text, delta bigint);
});

# 8 sessions of draws and increments, a third rolled back, until stop_load
sub load
{
	my ($tag, $counter) = @_;
	srand(unpack "%32C*", $tag);
	my @scripts;
	for (1 .. 8)
	{
		my $sql = '';
		for my $i (1 .. 40000)
		{
			$sql .= stop_point($tag) if $i % 10 == 1;
			my $end = rand() < 0.3 ? 'ROLLBACK' : 'COMMIT';
			if (rand() < 0.5)
			{
				my $n = (1, 1, 3)[ int rand 3 ];
				$sql .= "BEGIN; SELECT sharded_nextval('ms') FROM generate_series(1, $n); $end;\n";
			}
			else
			{
				my $d = 1 + int rand 9;
				$sql .= "BEGIN; SELECT counter_incr('$counter', $d) \\g /dev/null\n"
				  . "INSERT INTO ledger VALUES ('$counter', $d); $end;\n";
			}
		}
		push @scripts, $sql;
	}
	return load_start($node, $db, $tag, @scripts);
}

# the sequence's and the counter's statistics, summed
sub stats
{
	my ($what) = @_;
	return sql("SELECT coalesce(sum($what), 0) FROM sharded_seq.memcached_stats WHERE name IN ('ms', 'bc')");
}
sub stats_above
{
	my ($what, $than, $why) = @_;
	$node->poll_query_until($db,
		"SELECT sum($what) > $than FROM sharded_seq.memcached_stats WHERE name IN ('ms', 'bc')")
	  or die "timed out waiting for $why";
	return;
}

# phase 1: each fault once the load has used memcached since the one before
my $p1 = load('p1', 'bc');
stats_above('hits', 0, 'the load to use memcached');
my $rebuilds = stats('rebuilds');
is($mc->command('flush_all'), 'OK', 'flush_all under load');
stats_above('rebuilds', $rebuilds, 'a lease rebuilt after flush_all');
my $misses = stats('fallbacks + errors');
$mc->kill('KILL');
stats_above('fallbacks + errors', $misses, 'the load to notice memcached killed');
$mc->start;
my $hits = stats('hits');
stats_above('hits', $hits, 'the load to use the restarted memcached');
is( sql("SELECT bool_and(healthy) FROM sharded_seq.memcached_servers()"), 't',
	'the restarted memcached is healthy');
$mc->kill('TERM');
is( sql("SELECT bool_or(healthy) FROM sharded_seq.memcached_servers()"), 'f',
	'memcached taken down: no server healthy');
$misses = stats('fallbacks + errors');
stats_above('fallbacks + errors', $misses, 'the load to go on without memcached');
ok(load_running($p1) == 8, 'the load ran through every fault');
stop_load($node, $db, 'p1');
my ($out1, $err1) = load_finish($p1);
is(join('', @$err1), '', 'no session saw an error through the faults');
values_check('phase 1 (faults)', @$out1);

# memcached back (empty): what it lost is gone, but nothing counts twice
$mc->start;
sql("SELECT sharded_seq.flush_counters()");
my ($total, $ledger) = split /\|/,
  sql("SELECT counter_value('bc'), (SELECT sum(delta) FROM ledger WHERE counter = 'bc')");
note("RESULT after the faults: memcached total $total, true sum $ledger (lost "
	  . ($ledger - $total) . ')');
ok($total <= $ledger, 'after the faults, the total is at most the committed sum');
ok($total > 0, 'after the faults, the counter counted');

# phase 2: memcached up throughout, the tier switched under load, then a
# clean flush must make the total exact
sql("SELECT sharded_seq.create_counter('bc2', shards => 4, mode => 'memcached')");
# more than memcached can add in one step: it takes the exact path
sql("BEGIN; SELECT counter_incr('bc2', 5000000000); INSERT INTO ledger VALUES ('bc2', 5000000000); COMMIT;");
sub ledger_above
{
	my ($n) = @_;
	$node->poll_query_until($db, "SELECT count(*) > $n FROM ledger WHERE counter = 'bc2'")
	  or die 'timed out waiting for the load';
	return sql("SELECT count(*) FROM ledger WHERE counter = 'bc2'");
}
my $p2 = load('p2', 'bc2');
my $n = ledger_above(200);
sql("SELECT sharded_seq.alter_sequence('ms', tier => 'database')");
ledger_above($n + 200);
$hits = stats('hits');
sql("SELECT sharded_seq.alter_sequence('ms', tier => 'memcached', block => 300)");
stats_above('hits', $hits, 'draws through memcached again');
ok(load_running($p2) == 8, 'the load ran through both tier switches');
stop_load($node, $db, 'p2');
my ($out2, $err2) = load_finish($p2);
is(join('', @$err2), '', 'no session saw an error through the tier switches');
is( sql("SELECT tier || ' block ' || block FROM sharded_seq.sequences WHERE name = 'ms'"),
	'memcached block 300', 'tier switched database -> memcached online');
my $flushed = sql("SELECT sharded_seq.flush_counters()");
my $pending;
($total, $ledger, $pending) = split /\|/, sql(
	"SELECT counter_value('bc2'), (SELECT sum(delta) FROM ledger WHERE counter = 'bc2'), (SELECT pending FROM sharded_seq.counters WHERE name = 'bc2')"
);
note("RESULT after a clean flush ($flushed flushed): memcached total $total, true sum $ledger, pending $pending");
is("$total $pending", "$ledger 0", 'with memcached up, a clean flush makes the total exact');
values_check('phases 1 and 2', @$out1, @$out2);
note('RESULT stats: '
	  . sql("SELECT string_agg(kind || ' ' || name || ' hits=' || hits || ' rebuilds=' || rebuilds || ' fallbacks=' || fallbacks || ' errors=' || errors || ' flushes=' || flushes, '; ') FROM sharded_seq.memcached_stats"));
is( sql("SELECT rebuilds > 0 AND fallbacks > 0 AND hits > 0 FROM sharded_seq.memcached_stats WHERE name = 'ms'"),
	't', 'the sequence counted hits, rebuilds and fallbacks');

done_testing();

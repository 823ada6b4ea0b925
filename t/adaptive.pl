# C1 for adaptive counters (preloaded, so reads go through remembered rows
# and the worker runs maintain() too): a counter that counter_incr creates
# grows under contention, maintain() folds and gathers its rows while
# increments and readers go on, the idle counter ends as one row, and an
# immediate shutdown in the middle of it all loses nothing committed.  Every
# increment writes its delta to a ledger in the same transaction, so the
# total must equal the ledger's sum exactly; readers check that in every
# statement (READ COMMITTED) and across statements (REPEATABLE READ).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

# fsync on (PostgreSQL::Test::Cluster turns it off): commits that wait for
# their WAL flush overlap, the contention that makes the counter grow
my $node = ssq_node('main', preload => 1,
	conf => "sharded_seq.counter_fold_after = 1\nfsync = on\n");
my $db = 'stress';
sub sql { return $node->safe_psql($db, $_[0]); }
# what maintain() moved, call by call
sql(q{
CREATE TABLE ledger (counter text, delta bigint);
CREATE TABLE moved (phase text, n int);
});
my $dir = $PostgreSQL::Test::Utils::tmp_check;
# pgbench's load: a fifth of the transactions rolled back
PostgreSQL::Test::Utils::append_to_file("$dir/incr.pgbench", q{
\set d random(-3, 10)
\set r random(1, 5)
BEGIN;
SELECT counter_incr('hot', :d);
INSERT INTO ledger VALUES ('hot', :d);
\if :r = 1
ROLLBACK;
\else
COMMIT;
\endif
});
sub pgbench
{
	my ($out, @args) = @_;
	return IPC::Run::start(
		[
			$node->installed_command('pgbench'), '-n', '-c', '16', '-j', '2', @args,
			'-f', "$dir/incr.pgbench", $node->connstr($db)
		],
		'>', $out, '2>&1');
}
sub rows { return sql("SELECT shards FROM sharded_seq.counters WHERE name = 'hot'"); }
sub check_total
{
	my ($what) = @_;
	my ($total, $ledger, $n) = split /\|/, sql(
		"SELECT counter_value('hot'), (SELECT coalesce(sum(delta), 0) FROM ledger WHERE counter = 'hot'), (SELECT count(*) FROM ledger WHERE counter = 'hot')"
	);
	note("RESULT $what: total=$total ledger=$ledger committed increments=$n rows=" . rows());
	is($total, $ledger, "$what: the total equals the ledger");
	return;
}
# a session calling maintain() every 100 ms until stop_load(TAG)
sub maintain_loop
{
	my ($tag) = @_;
	my $once = stop_point($tag)
	  . "INSERT INTO moved SELECT '$tag', folded + compacted FROM sharded_seq.maintain(); SELECT pg_sleep(0.1);\n";
	return load_start($node, $db, "maint_$tag", $once x 3000);
}

# 1. 16 sessions on a counter that counter_incr creates: it must grow
my $grow = "$dir/grow.out";
pgbench($grow, '-t', '500')->finish or die "pgbench failed: " . slurp_file($grow);
my $grown = rows();
check_total('grow');
cmp_ok($grown, '>=', 4, 'the counter grew under contention');

# 2. increments, readers and maintain() at once, until maintain() folded or
# gathered something
srand(2);
my @incr;
for (1 .. 4)
{
	my $sql = '';
	for my $i (1 .. 20000)
	{
		$sql .= stop_point('load') if $i % 10 == 1;
		my $stmts = '';
		for (1 .. (1, 1, 2)[ int rand 3 ])
		{
			my $d = -3 + int rand 14;
			$stmts .= "SELECT counter_incr('hot', $d); INSERT INTO ledger VALUES ('hot', $d); ";
		}
		my $end = rand() < 0.2 ? 'ROLLBACK' : 'COMMIT';
		$sql .= "BEGIN; $stmts$end; SELECT pg_sleep(0.005);\n";
	}
	push @incr, $sql;
}
# a reader fails with division_by_zero when the total and the ledger differ
my $check = "SELECT 1 / (counter_value('hot') = (SELECT coalesce(sum(delta), 0) FROM ledger WHERE counter = 'hot'))::int;";
my $read = (stop_point('load')
	  . "$check\nBEGIN ISOLATION LEVEL REPEATABLE READ; $check SELECT pg_sleep(0.02); $check COMMIT;\n")
  x 10000;
my $load = load_start($node, $db, 'load', @incr);
my $readers = load_start($node, $db, 'read', $read, $read);
my $maint = maintain_loop('load');
$node->poll_query_until($db, "SELECT sum(n) > 0 FROM moved WHERE phase = 'load'")
  or die 'maintain() did nothing during the load';
is(load_running($load) + load_running($readers), 6,
	'maintain() folded or gathered rows while the load ran');
stop_load($node, $db, 'load');
my @err = map { @{ (load_finish($_))[1] } } $load, $readers, $maint;
is(join('', @err), '', 'no session saw an error (no read differed from the ledger)');
note('RESULT maintain() during the load: '
	  . sql("SELECT sum(n) || ' counters folded or gathered in ' || count(*) || ' calls' FROM moved WHERE phase = 'load'"));
check_total('load');

# 3. idle: fold passes bring it back to one row
poll_until(
	sub { sql('SELECT sharded_seq.maintain()'); rows() == 1 },
	'the idle counter folded back to one row');
pass('the idle counter was folded back to one row');
check_total('idle');

# 4. growth and folding under load, then an immediate shutdown
my $crash = "$dir/crash.out";
my $bench = pgbench($crash, '-T', '600');
$maint = maintain_loop('crash');
$node->poll_query_until($db,
	"SELECT count(*) > 2 FROM moved WHERE phase = 'crash'") or die 'no maintain() calls';
$node->poll_query_until($db,
	"SELECT shards > 1 FROM sharded_seq.counters WHERE name = 'hot'") or die 'no growth';
$node->stop('immediate');
ok(!$bench->finish, 'the load was under way at the immediate shutdown');
like(slurp_file($crash), qr/connection|terminat|server closed/i, 'pgbench stopped on the crash');
load_finish($maint);
$node->start;
check_total('crash');

done_testing();

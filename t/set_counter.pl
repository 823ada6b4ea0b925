# sharded_seq.set_counter under concurrent increments (issue 22, part 4): the
# committed total equals the set total at the set's commit, in every mode.
# Sessions increment counters in modes exact, buffered and memcached (positive
# and negative deltas, a quarter rolled back), each committed increment also
# writing its delta to table ledger in its transaction, while a setter sets
# each counter again and again (some sets rolled back, some in a rolled-back
# savepoint), writing each committed set to table sets in its transaction.
# With track_commit_timestamp, ledger rows and sets are ordered by commit:
# every counter's total must equal its last set plus the ledger's increments
# that committed after it, before and after flush_counters().  Run on a
# preloaded server with memcached (exact, buffered, memcached batched through
# shared memory and not), then on one not preloaded (exact, memcached).
# Then the README's recount and set under inserts that increment in their
# transaction: each counter ends equal to its table's count.  Then memcached
# down: set_counter refuses (08006) rather than leave memcached's amount to
# count on top later.  Then leftovers (an amount memcached could not take
# after its commit, held in its session until that session's next counter
# commit or exit, made by stopping memcached while a commit waits at wait
# point counter-memcached-decided): one committed before a set of another
# session's is absorbed, at the next commit or at exit; one after the last
# set counts; a set in its own session absorbs it, unless rolled back.
# Then, on a fresh server and memcached: a transaction's increments around
# its own set, memcached gone at its commit, count.  Then two sets in one
# transaction: in ascending counter id, or a deadlock whose hint says so.
# Last, a session that cannot reach memcached while it holds a 'memcached'
# counter's amount: its set, and its move out of the mode, are refused.
#
# SSQ_SET_NAIVE=1 replaces each set by counter_incr(total - counter_value()),
# the way without set_counter: the checks then fail (concurrent commits are
# counted twice or lost), which shows that they can.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;
use ShardedSeq::Memcached;

my $naive = $ENV{SSQ_SET_NAIVE} ? 1 : 0;
my $mc = ShardedSeq::Memcached->new;
my $db = 'stress';
my $conf = "track_commit_timestamp = on\n"
  . "sharded_seq.memcached_servers = '" . $mc->servers . "'\n"
  . "sharded_seq.counter_flush_interval = 1\n";

# the SQL of one set of counter c to total, as the setter runs it
sub set_sql
{
	my ($c, $total) = @_;
	return $naive
	  ? "SELECT counter_incr('$c', $total - counter_value('$c'));"
	  : "SELECT sharded_seq.set_counter('$c', $total);";
}

# one incrementing session: transactions of one or two increments
sub incr_script
{
	my ($tag, $seed, @counters) = @_;
	srand($seed);
	my $sql = '';
	for my $i (1 .. 100000)
	{
		$sql .= stop_point($tag) if $i % 20 == 1;
		$sql .= 'BEGIN;';
		for (1 .. 1 + int rand 2)
		{
			my $c = $counters[ int rand @counters ];
			my $d = int(rand(14)) - 3;
			$sql .= " SELECT counter_incr('$c', $d); INSERT INTO ledger VALUES ('$c', $d);";
		}
		$sql .= rand(100) < 25 ? " ROLLBACK;\n" : " COMMIT;\n";
	}
	return $sql;
}

# the setter: ROUNDS rounds over the counters; a set is committed, rolled
# back, or rolled back to a savepoint (then its transaction commits nothing)
sub set_script
{
	my ($rounds, @counters) = @_;
	srand(42);
	my $sql = '';
	for my $r (1 .. $rounds)
	{
		for my $c (@counters)
		{
			my $total = int(rand(2_000_000)) - 500_000;
			my $how = rand 100;
			if ($how < 15)
			{
				$sql .= "BEGIN; " . set_sql($c, $total) . " ROLLBACK;\n";
			}
			elsif ($how < 25)
			{
				$sql .= "BEGIN; SAVEPOINT s; " . set_sql($c, $total)
				  . " ROLLBACK TO SAVEPOINT s; COMMIT;\n";
			}
			else
			{
				$sql .= "BEGIN; " . set_sql($c, $total)
				  . " INSERT INTO sets VALUES ('$c', $total); COMMIT;\n";
			}
			# pacing only: any length is correct
			$sql .= "SELECT pg_sleep(0.01);\n";
		}
		$sql .= "SELECT 'round $r';\n";
	}
	return $sql;
}

# Each counter: its last committed set, the ledger's increments that
# committed after it, the total, and how many increments committed in the
# same microsecond as the set (their order is unknown: they must be none).
my $check_sql = q{
WITH last AS (
  SELECT DISTINCT ON (counter) counter, total, pg_xact_commit_timestamp(xmin) AS ts
    FROM sets ORDER BY counter, pg_xact_commit_timestamp(xmin) DESC)
SELECT l.counter,
       l.total + coalesce((SELECT sum(delta) FROM ledger g WHERE g.counter = l.counter
                            AND pg_xact_commit_timestamp(g.xmin) > l.ts), 0),
       counter_value(l.counter),
       (SELECT count(*) FROM ledger g WHERE g.counter = l.counter
           AND pg_xact_commit_timestamp(g.xmin) = l.ts),
       (SELECT count(*) FROM sets s WHERE s.counter = l.counter),
       (SELECT count(*) FROM ledger g WHERE g.counter = l.counter
           AND pg_xact_commit_timestamp(g.xmin) > l.ts)
  FROM last l ORDER BY 1};

# check_totals(NODE, WHAT, NCOUNTERS [, SETTLE]): each counter's total is its
# last set plus the increments committed after it.  With SETTLE, while the
# worker may still be moving amounts: counter_value reads each place before
# the place amounts come from, so an amount in flight is missed for a moment
# (never counted twice; engine.c, VisibleTotal); the check then waits, bounded,
# for a reading between two moves, and fails as before if none comes.
sub check_totals
{
	my ($node, $what, $ncounters, $settle) = @_;
	my @lines = split /\n/, $node->safe_psql($db, $check_sql);
	# with SETTLE, the reading checked is the one that came between two
	# moves, not a later one that another move may cut (bounded, as
	# poll_query_until is)
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while ($settle && time < $deadline
		&& grep { my @f = split /\|/; $f[1] ne $f[2] } @lines)
	{
		select(undef, undef, undef, 0.1);
		@lines = split /\n/, $node->safe_psql($db, $check_sql);
	}
	is(scalar @lines, $ncounters, "$what: every counter was set");
	for (@lines)
	{
		my ($c, $expected, $total, $ties, $sets, $after) = split /\|/;
		note("RESULT $what: counter $c sets=$sets increments_after_last_set=$after "
			  . "expected=$expected total=$total");
		is($total, $expected,
			"$what: counter $c is its last set plus the increments committed after it");
		is($ties, 0, "$what: counter $c: no increment committed in the set's microsecond");
	}
	return;
}

sub run
{
	my ($node, $tag, $rounds, @counters) = @_;
	$node->safe_psql($db, q{
CREATE TABLE ledger (counter text, delta bigint);
CREATE TABLE sets (counter text, total bigint);
});
	worker_settled($node, $db) if $node->safe_psql($db, 'SHOW shared_preload_libraries') =~ /sharded_seq/;
	my $load = load_start($node, $db, "incr_$tag",
		map { incr_script($tag, "$tag$_", @counters) } 1 .. 4);
	load_progress($load, 20);
	my $setter = load_start($node, $db, "set_$tag", set_script($rounds, @counters));
	my ($out, $err) = load_finish($setter);
	stop_load($node, $db, $tag);
	my (undef, $errs) = load_finish($load);
	is($err->[0], '', "$tag: no set failed");
	is(join('', @$errs), '', "$tag: no increment failed");
	like($out->[0], qr/round $rounds/, "$tag: the setter ran every round");
	check_totals($node, "$tag, before any flush", scalar @counters, 1);
	$node->safe_psql($db, 'SELECT sharded_seq.flush_counters()');
	check_totals($node, "$tag, after flush_counters()", scalar @counters);
	$node->safe_psql($db, 'DROP TABLE ledger, sets');
	return;
}

# 1. preloaded, with memcached: every mode, memcached batched and not
my $node = ssq_node('main', preload => 1, conf => $conf);
$node->safe_psql($db, q{
SELECT sharded_seq.create_counter('e', mode => 'exact');
SELECT sharded_seq.create_counter('e4', shards => 4);
SELECT sharded_seq.create_counter('b', mode => 'buffered');
SELECT sharded_seq.create_counter('m', mode => 'memcached');
});
run($node, 'batched', 12, qw(e e4 b m));
$node->append_conf('postgresql.conf', "sharded_seq.memcached_batch_delay = 0\n");
$node->reload;
run($node, 'unbatched', 8, qw(e b m));

# 2. the README's recount and set, under inserts that each increment a
# counter of their table's rows in their transaction: after it, and after
# more inserts, each counter equals its table's count
$node->safe_psql($db, q{
SELECT sharded_seq.create_counter('rows_e', mode => 'exact');
SELECT sharded_seq.create_counter('rows_b', mode => 'buffered');
SELECT sharded_seq.create_counter('rows_m', mode => 'memcached');
CREATE TABLE items (counter text, n int);
});
sub insert_script
{
	my ($seed) = @_;
	srand($seed);
	my $sql = '';
	for my $i (1 .. 100000)
	{
		$sql .= stop_point('recount') if $i % 20 == 1;
		my $c = (qw(rows_e rows_b rows_m))[ int rand 3 ];
		$sql .= "BEGIN; INSERT INTO items VALUES ('$c', $i); SELECT counter_incr('$c');"
		  . (rand(100) < 25 ? " ROLLBACK;\n" : " COMMIT;\n");
	}
	return $sql;
}
my $inserts = load_start($node, $db, 'recount', map { insert_script("r$_") } 1 .. 4);
load_progress($inserts, 20);
# drift first (a bad increment by hand), then recount and set, twice
my $recount = '';
for my $c (qw(rows_e rows_b rows_m))
{
	$recount .= "SELECT counter_incr('$c', 1000);\n"
	  . "BEGIN;\n" . set_sql($c, 0) . "\n"
	  . set_sql($c, "(SELECT count(*) FROM items WHERE counter = '$c')") . "\n"
	  . "COMMIT;\n" for 1 .. 2;
}
my ($rc_out, $rc_err) = load_finish(load_start($node, $db, 'recounter', $recount));
is($rc_err->[0], '', 'recount and set: no set failed');
load_progress($inserts, 60);
stop_load($node, $db, 'recount');
my (undef, $ins_errs) = load_finish($inserts);
is(join('', @$ins_errs), '', 'recount and set: no insert failed');
for my $flush (0, 1)
{
	$node->safe_psql($db, 'SELECT sharded_seq.flush_counters()') if $flush;
	my $res = $node->safe_psql($db, q{
SELECT c, counter_value(c), (SELECT count(*) FROM items WHERE counter = c)
  FROM unnest(ARRAY['rows_b', 'rows_e', 'rows_m']) c});
	for (split /\n/, $res)
	{
		my ($c, $total, $count) = split /\|/;
		note("RESULT recount and set, flushed=$flush: counter $c total=$total rows=$count");
		is($total, $count, "recount and set (flushed=$flush): counter $c equals its table's count");
	}
}

# 3. memcached down: the amount it holds cannot be absorbed, so no set
$node->safe_psql($db, "SELECT counter_incr('m', 5)");
$mc->kill;
my ($rc, $stdout, $stderr) = $node->psql($db,
	"\\set VERBOSITY verbose\nSELECT sharded_seq.set_counter('m', 7)");
like($stderr, qr/ERROR:  08006: cannot set counter "m": memcached cannot be read/,
	'memcached down: set_counter refuses with 08006');
$node->safe_psql($db, "SELECT sharded_seq.set_counter('b', 7)");
is($node->safe_psql($db, "SELECT counter_value('b')"), '7',
	'memcached down: a counter in another mode is set');
$mc->start;

# 4. leftovers: an amount that found memcached gone after its
# commit waits in its backend's memory until that backend's next counter
# commit or its exit.  A set that commits before then absorbs it (it
# committed before the set), so it must not count on top; one committed after
# the last set must count.  A commit is held at wait point
# counter-memcached-decided (decided for memcached, not yet committed) while
# memcached is stopped, so its delivery after commit finds no server.
$node->safe_psql($db, q{
SELECT sharded_seq.create_counter('lo', mode => 'memcached'), sharded_seq.create_counter('lo_e');
SELECT counter_incr('lo', 1000);
SELECT sharded_seq.flush_counters();
});
sub lo_value { return $node->safe_psql($db, "SELECT counter_value('lo')"); }

# leftover(N): a new session commits counter_incr('lo', N), which is left
# over in its memory; returns the session
sub leftover
{
	my ($n) = @_;
	my $s = $node->background_psql($db);
	my $pid = $s->query_safe('SELECT pg_backend_pid()');
	my $hold = wait_point_hold($node, $db, 'counter-memcached-decided', $pid);
	$s->query_until(qr/sent/, "\\echo sent\nSELECT counter_incr('lo', $n);\n");
	is(wait_point_reached($node, $db, 'counter-memcached-decided'), $pid,
		"leftover of $n: its commit waits, decided for memcached");
	$mc->kill;
	wait_point_release($hold);
	$s->query_safe('SELECT 1');    # the commit has returned
	$mc->start;
	$s->{pid} = $pid;
	return $s;
}
# the SQL of a set of 'lo' by a session that has just found memcached down:
# its connection tries the server again only after a second, so the set is
# tried again, in a savepoint each time, until memcached answers (polled,
# bounded)
sub set_retrying
{
	my ($total) = @_;
	return "DO \$\$ BEGIN FOR i IN 1 .. 600 LOOP BEGIN "
	  . "PERFORM sharded_seq.set_counter('lo', $total); RETURN; "
	  . "EXCEPTION WHEN connection_failure THEN PERFORM pg_sleep(0.05); END; END LOOP; "
	  . "RAISE 'memcached did not answer'; END \$\$;";
}
my $offset = -s $node->logfile;
my $ls = leftover(5);
is(lo_value(), 1000, 'a leftover is not in the rows, nor in memcached');
$node->safe_psql($db, "SELECT sharded_seq.set_counter('lo', 100)");
$node->safe_psql($db, "SELECT counter_incr('lo', 7)");
is($ls->query_safe("SELECT counter_value('lo')"), 107,
	"another session's set: the leftover's session no longer counts it");
$ls->query_safe("SELECT counter_incr('lo_e', 1)");
$node->safe_psql($db, 'SELECT sharded_seq.flush_counters()');
my $got = lo_value();
note("RESULT leftover of 5 before a set to 100, then 7: total=$got (want 107)");
is($got, 107, "a leftover another session's set absorbed does not count at that session's next commit");
like(slurp_file($node->logfile, $offset),
	qr/5 committed increments of counter "lo" left in this backend are dropped: a set_counter absorbed them/,
	'... and its drop is logged');
$ls->quit;

$ls = leftover(3);
$node->safe_psql($db, "SELECT sharded_seq.set_counter('lo', 50)");
$ls->quit;
ok($node->poll_query_until($db, "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $ls->{pid}"),
	'the session with a leftover exits');
$got = lo_value();
note("RESULT leftover of 3 before a set to 50, written at exit: total=$got (want 50)");
is($got, 50, '... nor at its exit');

$ls = leftover(4);
$ls->query_safe("SELECT counter_incr('lo_e', 1)");
is(lo_value(), 54, 'a leftover committed after the last set counts');
$ls->quit;

$ls = leftover(6);
$ls->query_safe(set_retrying(10));
$ls->query_safe("SELECT counter_incr('lo_e', 1)");
is(lo_value(), 10, "a set in the leftover's own session absorbs it");
$ls->quit;

$ls = leftover(2);
$ls->query_safe('BEGIN; ' . set_retrying(0) . ' ROLLBACK;');
$ls->query_safe('BEGIN; SAVEPOINT s; ' . set_retrying(0) . ' ROLLBACK TO SAVEPOINT s; COMMIT;');
is($ls->query_safe("SELECT counter_value('lo')"), 12,
	'a set rolled back, or in a rolled-back savepoint, in its own session: the leftover still counts there');
$ls->query_safe("SELECT counter_incr('lo_e', 1)");
is(lo_value(), 12, '... and in the rows at its next commit');
$ls->quit;
$node->stop;

# 5. not preloaded: no slots ('buffered' needs them), memcached without batching
my $plain = ssq_node('plain', preload => 0, conf => $conf);
$plain->safe_psql($db, q{
SELECT sharded_seq.create_counter('e', mode => 'exact');
SELECT sharded_seq.create_counter('m', mode => 'memcached');
});
run($plain, 'plain', 8, qw(e m));
$plain->stop;

# 6. a transaction that increments before and after its own set of a
# 'memcached' counter, memcached stopped between its last statement and its
# COMMIT: its amount goes to the rows the set holds, and counts on top of the
# set.  Sent to memcached after commit, it was lost (99, not 105): the
# session's connection had just sent an amount, so it wrote the next one to
# the dead server unchecked, an unknown outcome, never sent twice.  A fresh
# memcached and server: the first stop of a server is the one that lost it.
my $mc6 = ShardedSeq::Memcached->new;
my $own = ssq_node('ownset', preload => 1,
	conf => "sharded_seq.memcached_servers = '" . $mc6->servers . "'\n"
	  . "sharded_seq.memcached_batch_delay = 0\n");
$own->safe_psql($db, q{
SELECT sharded_seq.create_counter('lo', mode => 'memcached'), sharded_seq.create_counter('lo_e');
});
$ls = $own->background_psql($db);
$ls->query_safe("SELECT counter_incr('lo', 1)");
$ls->query_safe("BEGIN; SELECT counter_incr('lo', 1); SELECT sharded_seq.set_counter('lo', 100); SELECT counter_incr('lo', 5)");
$mc6->kill;
$ls->query_safe('COMMIT');
$mc6->start;
is($ls->query_safe("SELECT counter_value('lo')"), 105,
	'increments before and after the own set, memcached gone at commit: they count in the session');
$ls->query_safe("SELECT counter_incr('lo_e', 1)");
$ls->quit;
$got = $own->safe_psql($db, "SELECT counter_value('lo')");
note("RESULT incr 1, set to 100, incr 5 in one transaction, memcached gone at its commit: total=$got (want 105)");
is($got, 105, '... and in the rows');

# 7. two sets in one transaction against a commit that increments both
# counters (it takes them in ascending id): in ascending id the commit waits
# for the set's transaction and counts on top; in descending id the second set
# waits for that commit, which waits for the first set: a deadlock.  The
# commit's deadlock check runs (10 ms) before the set waits, and finds none,
# so the set's finds it, and its hint gives the order.
$own->safe_psql($db, q{
SELECT sharded_seq.create_counter('dx'), sharded_seq.create_counter('dy');
});
my $ws = $own->background_psql($db, on_error_stop => 0);
my $wc = $own->background_psql($db, on_error_stop => 0);
my $wc_pid = $wc->query_safe('SELECT pg_backend_pid()');
$wc->query_safe("SET deadlock_timeout = '10ms'");
# the commit's, waiting for a lock for longer than its deadlock_timeout
my $commit_waits = "SELECT count(*) > 0 FROM pg_catalog.pg_locks WHERE pid = $wc_pid"
  . " AND NOT granted AND waitstart < pg_catalog.clock_timestamp() - interval '200 ms'";
for my $order (['dx', 'dy'], ['dy', 'dx'])
{
	my ($first, $second) = @$order;
	my $tag = "sets of $first then $second";
	$own->safe_psql($db, "SELECT sharded_seq.set_counter('dx', 10), sharded_seq.set_counter('dy', 10)");
	$ws->query_safe("BEGIN; SELECT sharded_seq.set_counter('$first', 0)");
	$wc->query_until(qr/sent/, "\\echo sent\nBEGIN; SELECT counter_incr('dx', 1), counter_incr('dy', 1); COMMIT;\n");
	ok($own->poll_query_until($db, $commit_waits), "$tag: the commit of both waits");
	my ($out, $err) = bg_query($ws, "SELECT sharded_seq.set_counter('$second', 0)");
	$ws->query('COMMIT');
	$wc->query_safe('SELECT 1');    # the commit has returned
	my $totals = $own->safe_psql($db, "SELECT counter_value('dx') || ',' || counter_value('dy')");
	if ($first eq 'dx')
	{
		is($err, '', "$tag: the second set waits for nothing");
		is($totals, '1,1', "$tag: the commit counts on top of both");
	}
	else
	{
		like($err, qr/deadlock detected/, "$tag: the second set deadlocks with the commit");
		like($err, qr/HINT:  This transaction set a counter with a higher id before "dx".*one per transaction, or in the order they were created/s,
			'... and its hint gives the order');
		is($totals, '11,11', "$tag: the commit counts, the sets are rolled back");
	}
}
$ws->quit;
$wc->quit;
$own->stop;

# 8. memcached holds a 'memcached' counter's committed amount (no worker
# flushes it: not preloaded) and a session cannot reach it (its
# memcached_servers emptied, as a build without libmemcached is): a set
# there, or leaving the mode, would let the amount count on top of the set
# total once flushed (set 5, flushed: 1005).  Both are refused.
my $mc8 = ShardedSeq::Memcached->new;
my $off = ssq_node('unreached', preload => 0,
	conf => "sharded_seq.memcached_servers = '" . $mc8->servers . "'\n");
$off->safe_psql($db, q{
SELECT sharded_seq.create_counter('ov', mode => 'memcached');
SELECT counter_incr('ov', 1000);
});
is($off->safe_psql($db, "SELECT sharded_seq.counter_pending(id) FROM sharded_seq.counter_config WHERE name = 'ov'"),
	1000, 'unreached: the amount is in memcached');
for my $call ("sharded_seq.set_counter('ov', 5)", "sharded_seq.alter_counter('ov', mode => 'exact')")
{
	my ($rc, $out, $err) = $off->psql($db,
		"SET sharded_seq.memcached_servers = ''; SELECT $call",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/ERROR:  55000: cannot [a-z ]+ counter "ov" \(mode 'memcached'\): sharded_seq.memcached_servers is empty/,
		"unreached: $call is refused");
	like($err, qr/HINT:  Set sharded_seq.memcached_servers to the servers that hold its amounts/, '... and says what to do');
}
$off->safe_psql($db, 'SELECT sharded_seq.flush_counters()');
is($off->safe_psql($db, "SELECT counter_value('ov') || ' ' || mode FROM sharded_seq.counters WHERE name = 'ov'"),
	'1000 memcached', 'unreached: once flushed, the total is the true sum (not the set plus the amount)');
$off->safe_psql($db, "SELECT sharded_seq.set_counter('ov', 5)");
$off->safe_psql($db, "SELECT counter_incr('ov', 1)");
$off->safe_psql($db, 'SELECT sharded_seq.flush_counters()');
is($off->safe_psql($db, "SELECT counter_value('ov')"), 6, 'unreached: with the servers set, the set counts, and what follows on top');
$off->stop;

done_testing();

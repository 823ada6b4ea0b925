# E5 after one large transaction: whatever a transaction did, once it has
# ended the session's memory is back under the bound, as if it had done the
# same work in small transactions (a pooled connection that ran one bulk job
# must not keep that job's memory).  Library preloaded.  Each case runs in a
# session of its own, which then reads its own memory in
# pg_backend_memory_contexts:
#   - the whole session under 16 MB, and at most 1 MB above a session that
#     did the same 100,000 counters in 100 transactions;
#   - TopMemoryContext under 1 MB (nothing of ours is left there);
#   - the extension's contexts other than its bounded caches under 1 MB.
# In the 'memcached' cases, what PostgreSQL's lock manager itself keeps after
# a transaction that held as many locks (measured) is set aside first.
# Cases: 100,000 new counters in one statement; the same, rolled back; 1,000
# savepoints, every other one rolled back; 100,000 'buffered' counters
# committed and then flushed in one transaction each; 20,000 'memcached'
# counters committed, flushed, and committed while memcached is down (the
# amounts wait as leftovers, one of them while its rows are held).  Totals
# are checked after each.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;
use ShardedSeq::Memcached;

my $mc = ShardedSeq::Memcached->new;
# each commit sends its own 'memcached' amounts; the worker flushes nothing
# by itself while the test runs; a commit locks each 'memcached' counter it
# adds to: 20,000 in one transaction
my $node = ssq_node(
	'memxact',
	preload => 1,
	conf => "sharded_seq.buffered_slots = 262144\n"
	  . "sharded_seq.memcached_servers = '" . $mc->servers . "'\n"
	  . "sharded_seq.memcached_batch_delay = 0\n"
	  . "sharded_seq.counter_flush_interval = 3600\n"
	  . "max_locks_per_transaction = 1024\n"
	  . "log_statement = none\n");
sub sql { return $node->safe_psql('stress', $_[0]); }
my ($n, $m) = (100000, 20000);
my $limit_kb = 16 * 1024;

# The session's memory in kB: all of it, TopMemoryContext, and the
# extension's contexts but for its caches (bounded by session_cache_size);
# then, to show what a failure is made of, the contexts over 256 kB.
my $measure = q{
SELECT 'memory', sum(total_bytes)::bigint / 1024,
       coalesce(sum(total_bytes) FILTER (WHERE name = 'TopMemoryContext'), 0)::bigint / 1024,
       coalesce(sum(total_bytes) FILTER (
           WHERE coalesce(ident, name) LIKE 'sharded\_seq%'
             AND coalesce(ident, name) NOT IN ('sharded_seq counters', 'sharded_seq sequences',
                                               'sharded_seq cache entries')), 0)::bigint / 1024
  FROM pg_backend_memory_contexts;
SELECT 'context', coalesce(ident, name), sum(total_bytes)::bigint / 1024
  FROM pg_backend_memory_contexts GROUP BY 2 HAVING sum(total_bytes) > 256 * 1024 ORDER BY 3 DESC;
};
# in_session(SQL): SQL in a session of its own, then that session's memory:
# [ total, top, ours, its big contexts ]
sub memory_of
{
	my ($out) = @_;
	my ($line) = $out =~ /^memory\|(.*)$/m;
	return [ split(/\|/, $line), join("\n", grep { /^context\|/ } split /\n/, $out) ];
}
sub in_session { return memory_of(sql($_[0] . ";\n" . $measure)); }
# in_background(SQL): the same, started in a session that runs it while the
# test goes on (the long flushes, while independent cases run);
# measured(SESSION) waits for it and returns that session's memory
sub in_background
{
	my $h = $node->background_psql('stress');
	$h->query_until(qr//, "$_[0];\n");
	return $h;
}
sub measured
{
	my ($h) = @_;
	my $out = $h->query_safe($measure);
	$h->quit;
	return memory_of($out);
}

# The counters the cases use exist before, made at once by three sessions:
# 'obj/' for the steady state, 'buf/' (buffered) and 'mc/' (memcached); and
# 'idle/', which no case touches: every flush_counters() visits every
# counter, and the flushes below run before the cases that make 'new/', so
# these stand for them (each flush visits at least the 300,000 counters it
# visited when it ran after them).
parallel_psql(
	$node, 'stress',
	"SELECT count(counter_incr('obj/' || g, 0)) FROM generate_series(1, $n) g;
	 SELECT count(sharded_seq.create_counter('mc/' || g, 1, 'memcached')) FROM generate_series(1, $m) g",
	"SELECT count(sharded_seq.create_counter('buf/' || g, 1, 'buffered')) FROM generate_series(1, $n) g",
	"SELECT count(counter_incr('idle/' || g, 0)) FROM generate_series(1, $n) g");

# the steady state: the same counters, 1,000 per transaction
my $base = in_session(qq{DO \$\$ BEGIN
    FOR i IN 0 .. 99 LOOP
        PERFORM counter_incr('obj/' || g, 0) FROM generate_series(i * 1000 + 1, i * 1000 + 1000) g;
        COMMIT;
    END LOOP;
END \$\$})->[0];
note("RESULT a session that incremented $n counters in 100 transactions holds $base kB");
cmp_ok($base, '<', $limit_kb, 'the steady state is under 16 MB');

# check(CASE, MEMORY [, PG_TOTAL_KB, PG_TOP_KB]): the memory a session was
# left with, less what PostgreSQL itself keeps
sub check
{
	my ($case, $mem, $pg_total, $pg_top) = @_;
	my ($total, $top, $ours, $contexts) = @$mem;
	note("RESULT after $case: $total kB in all (steady state $base kB), TopMemoryContext $top kB, sharded_seq outside its caches $ours kB"
		  . (defined $pg_total ? " (PostgreSQL itself keeps $pg_total kB after as many locks, $pg_top kB of it in TopMemoryContext)" : ''));
	$total -= $pg_total // 0;
	$top -= $pg_top // 0;
	my $fine = cmp_ok($total, '<', $limit_kb, "after $case the session holds less than the 16 MB of E5");
	$fine &= cmp_ok($total, '<=', $base + 1024, "... and at most 1 MB above the steady state");
	$fine &= cmp_ok($top, '<', 1024, '... TopMemoryContext under 1 MB');
	$fine &= cmp_ok($ours, '<', 1024, "... the extension's contexts besides its caches under 1 MB");
	diag($contexts) unless $fine;
	return;
}

worker_settled($node, 'stress');
check("$n buffered counters committed",
	in_session("SELECT count(counter_incr('buf/' || g)) FROM generate_series(1, $n) g"));
cmp_ok(sql('SELECT used FROM sharded_seq.buffered_slots()'), '>=', $n,
	'every buffered counter holds a slot (the buffered case measures something)');
# the flush runs while the lock manager's own share is measured
my $bflush = in_background('SELECT sharded_seq.flush_counters()');
my $fresh = in_session('SELECT 1');
my $locks = in_session("SELECT count(pg_advisory_xact_lock(g)) FROM generate_series(1, $m) g");
check("flushing $n buffered counters", measured($bflush));
my $got = sql("SELECT sum(counter_value('buf/' || g)) FROM generate_series(1, $n) g");
note("RESULT the $n buffered counters add up to $got");
is($got, $n, "the $n buffered counters add up to $n");

# A commit locks each 'memcached' counter it adds to, and a flush each
# counter it moves.  PostgreSQL's lock manager keeps memory after a
# transaction that held many locks (each lock's owner array, freed into
# TopMemoryContext, and the LOCALLOCK hash): that much is not ours.
my ($locks_total, $locks_top) = ($locks->[0] - $fresh->[0], $locks->[1] - $fresh->[1]);
check("$m memcached counters committed",
	in_session("SELECT count(counter_incr('mc/' || g)) FROM generate_series(1, $m) g"),
	$locks_total, $locks_top);
# the flush runs while the cases of new counters do (their counters are
# in mode 'exact': no flush moves anything of theirs)
my $mflush = in_background('SELECT sharded_seq.flush_counters()');
check("$n new counters in one statement",
	in_session("SELECT count(counter_incr('new/' || g)) FROM generate_series(1, $n) g"));
check("$n increments rolled back", in_session("BEGIN;
SELECT count(counter_incr('new/' || g, 5)) FROM generate_series(1, $n) g;
ROLLBACK"));
check('1,000 savepoints, half rolled back', in_session(q{DO $$ BEGIN
    FOR i IN 1 .. 1000 LOOP
        BEGIN
            PERFORM counter_incr('new/' || g) FROM generate_series(i * 100 - 99, i * 100) g;
            IF i % 2 = 0 THEN RAISE EXCEPTION 'undo'; END IF;
        EXCEPTION WHEN raise_exception THEN NULL;
        END;
    END LOOP;
END $$}));
$got = sql("SELECT sum(counter_value('new/' || g)) FROM generate_series(1, $n) g");
note("RESULT the $n new counters add up to $got");
is($got, $n + $n / 2, "the $n new counters add up to $n + $n / 2");

check("flushing $m memcached counters", measured($mflush), $locks_total, $locks_top);

# memcached goes away: one commit leaves every amount as a leftover of its
# session, the next commit writes them to the rows but one, whose rows
# another session holds; that one waits for a later commit
$mc->kill;
my $holder = $node->background_psql('stress');
$holder->query_safe(
	"BEGIN; SELECT 1 FROM sharded_seq.counter_shards WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = 'mc/1') FOR UPDATE"
);
my $lo = $node->background_psql('stress');
$lo->query_safe("SELECT count(counter_incr('mc/' || g)) FROM generate_series(1, $m) g");
$lo->query_safe("SELECT counter_incr('new/1', 0)");
check("$m memcached amounts left over, then written but one", memory_of($lo->query_safe($measure)),
	$locks_total, $locks_top);
my $waiting = sql("SELECT sum(counter_value('mc/' || g)) FROM generate_series(1, $m) g");
$holder->query_safe('COMMIT');
$holder->quit;
$lo->query_safe("SELECT counter_incr('new/1', 0)");
$lo->quit;
$got = sql("SELECT sum(counter_value('mc/' || g)) FROM generate_series(1, $m) g");
note("RESULT with memcached down, the $m memcached counters add up to $waiting in the rows while one leftover waits, then $got");
is($waiting, 2 * $m - 1, 'with memcached down, every amount but the held one reaches the rows');
is($got, 2 * $m, '... and the held one too, at a commit once its rows are free');

done_testing();

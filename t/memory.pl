# E5: a session's memory stays bounded however many counters and sequences
# it touches, and eviction from its caches loses nothing.
#   - one session reads and increments 100,000 distinct counters (in
#     transactions of 10,000): its memory contexts total under 16 MB, while a
#     session allowed to cache them all grows past that (the bound is real);
#   - with the smallest cache (16 entries), one transaction increments 1,000
#     counters, some in a rolled-back savepoint: every total is exact;
#   - the same cache, 40 sequences drawn from in turn: values increase per
#     sequence and sharded_currval survives eviction.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

my $node = ssq_node('memory');
sub sql { return $node->safe_psql('stress', $_[0]); }
my $n = 100000;
my $limit = 16 * 1024 * 1024;

sql("SELECT count(counter_incr('m' || g)) FROM generate_series(1, $n) g");
sql(q{CREATE PROCEDURE touch_all(n int) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 0 .. n / 10000 - 1 LOOP
        PERFORM counter_incr('m' || g) FROM generate_series(i * 10000 + 1, (i + 1) * 10000) g;
        COMMIT;
    END LOOP;
END $$});

# the memory one session ends with, having read and incremented every counter
sub touch_all
{
	my ($set) = @_;
	my @out = split /\n/, sql(($set // 'SELECT 1') . ";
SELECT count(counter_value('m' || g)) FROM generate_series(1, $n) g;
CALL touch_all($n);
SELECT sum(total_bytes) FROM pg_backend_memory_contexts");
	return $out[-1];
}
my $bounded = touch_all();
my $unbounded = touch_all('SET sharded_seq.session_cache_size = 10000000');
note(sprintf('RESULT memory after touching %d counters: %d kB with the default cache, %d kB caching them all',
		$n, $bounded / 1024, $unbounded / 1024));
cmp_ok($bounded, '<', $limit, "a session that touched $n counters holds less than 16 MB");
cmp_ok($unbounded, '>', $bounded, 'caching every counter takes more memory (the test measures something)');
my $total = sql("SELECT sum(counter_value('m' || g)) FROM generate_series(1, $n) g");
note("RESULT the $n counters add up to $total");
is($total, 3 * $n, "the $n counters add up to 3 each");

# eviction in the middle of a transaction's increments
sql(q{SET sharded_seq.session_cache_size = 16;
BEGIN;
SELECT count(counter_incr('e' || (g % 1000), 1)) FROM generate_series(0, 2999) g;
SAVEPOINT s;
SELECT count(counter_incr('e' || g, 100)) FROM generate_series(0, 499) g;
ROLLBACK TO s;
SELECT count(counter_incr('e' || g, 2)) FROM generate_series(0, 999, 2) g;
COMMIT});
is( sql(q{SELECT count(*) FROM generate_series(0, 999) g
           WHERE counter_value('e' || g) <> CASE WHEN g % 2 = 0 THEN 5 ELSE 3 END}),
	'0', '1000 counters incremented through a 16-entry cache, with a rolled-back savepoint: all exact');

# sequences through the same cache
sql("SELECT count(sharded_seq.create_sequence('s' || g, shards => 2, block => 3)) FROM generate_series(1, 40) g");
my @out = split /\n/, sql(q{SET sharded_seq.session_cache_size = 16;
CREATE TEMP TABLE drawn (seq int, round int, v bigint, cur bigint);
DO $$
BEGIN
    FOR r IN 1 .. 10 LOOP
        FOR s IN 1 .. 40 LOOP
            INSERT INTO drawn SELECT s, r, sharded_nextval('s' || s), sharded_currval('s' || s);
        END LOOP;
    END LOOP;
END $$;
SELECT count(*) FILTER (WHERE v <> cur),
       count(*) FILTER (WHERE v <= (SELECT max(d2.v) FROM drawn d2 WHERE d2.seq = d.seq AND d2.round < d.round)),
       count(DISTINCT (seq, v))
  FROM drawn d});
my ($wrong_cur, $backwards, $distinct) = split /\|/, $out[-1];
note("RESULT 400 values from 40 sequences through a 16-entry cache: currval wrong $wrong_cur, not increasing $backwards, distinct $distinct");
is($wrong_cur, '0', 'sharded_currval survives eviction');
is($backwards, '0', 'each sequence\'s values increase through eviction');
is($distinct, '400', 'no value twice');

done_testing();

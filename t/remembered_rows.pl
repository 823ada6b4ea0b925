# C1 for reads that skip the index.  With the library preloaded, a session
# remembers where an adaptive counter's rows are and reads them there while
# the counter's layout word stands still.  Orderings that would fool a
# careless version, driven step by step from a reading session R:
#   1. growth: R has remembered one row; a commit that finds that row held
#      adds a second one; R must count it;
#   2. an older snapshot: R, in REPEATABLE READ, read two rows; maintain()
#      folds them into one and R (same transaction) remembers the new layout
#      with a fresh snapshot; R's own snapshot must not be read through it;
#   3. R keeps a counter's rows and total (adaptive and pinned); another
#      session's increment must show in R's next read.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

# the worker stays out of the way: maintain() runs when the test says
my $node = ssq_node(
	'remembered',
	preload => 1,
	conf => "sharded_seq.counter_fold_after = 1\nsharded_seq.counter_flush_interval = 3600\n");
sub sql { return $node->safe_psql('stress', $_[0]); }
sub rows { return sql("SELECT shards FROM sharded_seq.counters WHERE name = '$_[0]'"); }

# grow(NAME, DELTA): add DELTA while another transaction holds every row of NAME
sub grow
{
	my ($name, $delta) = @_;
	my $h = $node->background_psql('stress');
	$h->query_safe(
		"BEGIN; SELECT shard FROM sharded_seq.counter_shards WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = '$name') FOR UPDATE"
	);
	sql("SELECT counter_incr('$name', $delta)");
	$h->query_safe('ROLLBACK');
	$h->quit;
	return;
}

note('1. growth after R remembered the rows');
sql("SELECT counter_incr('g', 1)");
is(rows('g'), '1', 'g starts as one row');
my $r = $node->background_psql('stress');
is($r->query_safe("SELECT counter_value('g'); SELECT counter_value('g')"), "1\n1", 'R reads g: 1');
grow('g', 5);
is(rows('g'), '2', 'the held row made g grow (the test is not void)');
my $got = $r->query_safe("SELECT counter_value('g')");
note("RESULT after growth R reads $got (want 6)");
is($got, '6', 'R counts the row added after it remembered the rows');
is($r->query_safe("SELECT counter_value('g')"), '6', "... and again in R's next read");

note('2. a REPEATABLE READ snapshot older than the remembered rows');
sql("SELECT counter_incr('f', 10)");
grow('f', 20);
is(rows('f'), '2', 'f grew (the test is not void)');
is($r->query_safe("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT counter_value('f')"), '30',
	'R, in REPEATABLE READ, reads f: 30');
# fold f back to one row: maintain() folds rows idle since its previous pass
sql(q{CREATE FUNCTION fold_f() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	PERFORM sharded_seq.maintain();
	RETURN (SELECT shards FROM sharded_seq.counters WHERE name = 'f') = 1;
END $$});
ok($node->poll_query_until('stress', 'SELECT fold_f()'), 'maintain() folds f (the test is not void)');
sql("SELECT counter_incr('f', 100)");
is(sql("SELECT counter_value('f')"), '130', 'f is 130 after the fold');
# R's first read after the fold sees the new word and remembers the new row;
# the next reads must still answer for R's snapshot
$got = $r->query_safe("SELECT counter_value('f'); SELECT counter_value('f'); SELECT counter_value('f')");
note("RESULT R's snapshot from before the fold reads: " . join(' ', split /\n/, $got) . ' (want 30 30 30)');
is($got, "30\n30\n30", 'R does not read through rows remembered with a newer snapshot');
is($r->query_safe("COMMIT; SELECT counter_value('f')"), '130', 'R after COMMIT reads 130');

note('3. an increment after R kept the rows and their total');
sql("SELECT counter_incr('k', 3)");
sql("SELECT sharded_seq.create_counter('kp', shards => 4)");
sql("SELECT counter_incr('kp', 3)");
for my $c (qw(k kp))
{
	# three reads: the second keeps the rows and total, the third uses them
	is( $r->query_safe("SELECT counter_value('$c'); SELECT counter_value('$c'); SELECT counter_value('$c')"),
		"3\n3\n3", "R reads $c: 3");
	sql("SELECT counter_incr('$c', 4)");
	$got = $r->query_safe("SELECT counter_value('$c')");
	note("RESULT $c after another session's increment, R reads $got (want 7)");
	is($got, '7', "R does not read $c from a total kept before another session's increment");
}
$r->quit;

done_testing();

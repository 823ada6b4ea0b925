# Mode 'memcached' batched through shared memory
# (sharded_seq.memcached_batch_delay): C2 with sharded_seq preloaded and a
# real memcached.
#   1. 8 sessions, a quarter of their transactions rolled back, while a
#      reader checks that no read is ever above the committed ledger and the
#      mode of a counter is switched: after flush_counters the total is exact,
#      and memcached took far fewer requests than there were commits;
#   2. a commit that read the mode before alter_counter left 'memcached'
#      commits after it: the worker's flushes count its amount; a commit after
#      drop_counter fails (42704) in both write-behind modes; flush_counters
#      never waits for another session's alter_counter; prepared transactions
#      holding other counters' rows hold nothing up: an immediate shutdown
#      loses nothing committed two worker rounds before;
#   3. memcached_batch_delay = 0: one request per commit, exact total;
#   4. an immediate shutdown under load: the total is at most the committed
#      sum, and at least what was committed before the worker's last whole
#      round;
#   5. memcached flush_all, then SIGKILL and a restart empty, under load: no
#      error reaches a caller, and no total is above the committed sum;
#   6. memcached restarted while the worker's connection sat idle: the
#      first amount forwarded after it reaches the new server or the rows.
# Each committed increment also writes its delta to a ledger in the same
# transaction.
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
sub session
{
	my $h = $node->background_psql($db, on_error_stop => 0);
	$h->set_query_timer_restart;
	$h->query_safe('\set VERBOSITY verbose');
	return $h;
}
# the SQLSTATEs of the errors a session got so far
sub errors_of { return join ' ', $_[0]->{stderr} =~ /ERROR: +([0-9A-Z]{5}):/g; }
# memcached's count of increments and decrements so far
sub mc_incrs
{
	my $n = 0;
	$n += $mc->stat_value($_) // 0 for qw(incr_hits incr_misses decr_hits decr_misses);
	return $n;
}
sub worker_round { ShardedSeq::Node::worker_round($node, $db); }

sql(q{
SELECT sharded_seq.create_counter('m', mode => 'memcached');
SELECT sharded_seq.create_counter('m4', shards => 4, mode => 'memcached');
SELECT sharded_seq.create_counter('m2', mode => 'memcached');
CREATE TABLE ledger (counter text, delta bigint, at timestamptz DEFAULT clock_timestamp());
CREATE TABLE above (read bigint, ledger bigint);
});
worker_settled($node, $db);

# SESSIONS sessions of positive increments of m and m4, 25% rolled back,
# until stop_load(TAG)
sub load
{
	my ($tag, $sessions) = @_;
	srand(unpack '%32C*', $tag);
	my @scripts;
	for (1 .. $sessions)
	{
		my $sql = '';
		for my $i (1 .. 20000)
		{
			$sql .= stop_point($tag) if $i % 10 == 1;
			my $stmts = '';
			for (1 .. (1, 1, 2)[ int rand 3 ])
			{
				my $d = 1 + int rand 9;
				my $name = (qw(m m m4))[ int rand 3 ];
				$stmts .= "SELECT counter_incr('$name', $d) \\g /dev/null\n"
				  . "INSERT INTO ledger (counter, delta) VALUES ('$name', $d); ";
			}
			$sql .= 'BEGIN; ' . $stmts . (rand() < 0.25 ? 'ROLLBACK' : 'COMMIT') . ";\n";
		}
		push @scripts, $sql;
	}
	return load_start($node, $db, $tag, @scripts);
}
sub commits_above
{
	my ($n) = @_;
	$node->poll_query_until($db, "SELECT count(*) > $n FROM ledger") or die 'the load stalled';
	return sql('SELECT count(*) FROM ledger');
}
sub no_errors
{
	my ($sessions, $what) = @_;
	my ($out, $err) = load_finish($sessions);
	is(join('', @$err), '', "$what: no caller got an error");
	return;
}
# check(OP, WHAT): each counter's total against its ledger, with OP (== or <=)
sub check
{
	my ($op, $what) = @_;
	for (split /\n/, sql(q{
SELECT c.name, counter_value(c.name), (SELECT coalesce(sum(delta), 0) FROM ledger l WHERE l.counter = c.name)
  FROM sharded_seq.counters c WHERE c.name IN ('m', 'm4') ORDER BY 1}))
	{
		my ($name, $total, $ledger) = split /\|/;
		note("RESULT $what: counter $name total=$total ledger=$ledger");
		cmp_ok($total, $op, $ledger, "$what: counter $name total $op ledger");
	}
	return;
}
sub reset_counts
{
	sql('SELECT sharded_seq.flush_counters()');
	sql('TRUNCATE ledger, above');
	sql('UPDATE sharded_seq.counter_shards SET value = 0');
	return;
}

# 1. batched: 8 sessions, a reader, mode switches, each once the load has
# gone on since the one before
reset_counts();
my $incr0 = mc_incrs();
my $p1 = load('p1', 8);
# every read is of increments committed before the ledger is read after it
my $reader = load_start($node, $db, 'reader', q{
DO $$
DECLARE v bigint; l bigint; reads int := 0;
BEGIN
  WHILE NOT EXISTS (SELECT FROM pg_catalog.pg_class WHERE relname = 'load_stop_p1') LOOP
    v := counter_value('m');
    SELECT coalesce(sum(delta), 0) INTO l FROM ledger WHERE counter = 'm';
    IF v > l THEN INSERT INTO above VALUES (v, l); END IF;
    reads := reads + 1;
  END LOOP;
  RAISE NOTICE 'reads: %', reads;
END $$;
});
my $n = 0;
for my $mode (qw(exact memcached buffered memcached exact memcached))
{
	$n = commits_above($n + 500);
	sql("SELECT sharded_seq.alter_counter('m4', mode => '$mode')");
}
commits_above(6000);
is(load_running($p1) + load_running($reader), 9, 'the load ran through 6 mode switches of m4');
stop_load($node, $db, 'p1');
no_errors($p1, 'batched');
my (undef, $rerr) = load_finish($reader);
like($rerr->[0], qr/^psql:[^\n]*: NOTICE: +reads: \d+\n\z/, 'the reader read throughout');
note("RESULT reader: $1") if $rerr->[0] =~ /(reads: \d+)/;
is(sql('SELECT count(*) FROM above'), '0', 'no read above the committed ledger')
  or diag(sql("SELECT read || ' > ' || ledger FROM above LIMIT 1"));
my $commits = sql('SELECT count(*) FROM ledger');
sql('SELECT sharded_seq.flush_counters()');
check('==', 'batched, after flush_counters');
my $incrs = mc_incrs() - $incr0;
note("RESULT $commits committed increments reached memcached in $incrs requests");
cmp_ok($incrs * 2, '<', $commits, 'batched: fewer than half as many memcached requests as commits');

# 2. a commit that saw mode 'memcached' after alter_counter left it: no
# flush_counters (it looks in memcached whatever the mode); the worker's
# rounds must bring the amount where an exact counter looks
my $late = session();
$late->query_safe("BEGIN; SELECT counter_incr('m2', 1000); INSERT INTO ledger (counter, delta) VALUES ('m2', 1000);");
sql("SELECT sharded_seq.alter_counter('m2', mode => 'exact')");
$late->query_safe('COMMIT');
worker_round();
worker_round();
is(sql("SELECT counter_value('m2')"), '1000',
	"the late commit's 1000, two worker rounds after alter_counter to 'exact'");
# the same, but the commit lands in shared memory before alter_counter
# commits: the worker, which cannot lock the counter meanwhile, must then
# not send it to memcached
sql("SELECT sharded_seq.alter_counter('m2', mode => 'memcached')");
my $alter = session();
$late->query_safe("BEGIN; SELECT counter_incr('m2', 1000); INSERT INTO ledger (counter, delta) VALUES ('m2', 1000);");
$alter->query_safe("BEGIN; SELECT sharded_seq.alter_counter('m2', mode => 'exact');");
$late->query_safe('COMMIT');
worker_round();    # a round while alter_counter is open
$alter->query_safe('COMMIT');
worker_round();
worker_round();
is(sql("SELECT counter_value('m2')"), '2000',
	"another 1000, committed while alter_counter to 'exact' was open, two worker rounds after");
$late->quit;

# a commit after another session dropped the counter fails, as an exact one
# does, whichever write-behind mode; nothing waits in a slot for nobody
for my $mode (qw(memcached buffered))
{
	sql("SELECT sharded_seq.create_counter('d', mode => '$mode')");
	$late = session();
	$late->query_safe("BEGIN; SELECT counter_incr('d', 5);");
	sql("SELECT sharded_seq.drop_counter('d'); SELECT sharded_seq.create_counter('d', mode => '$mode')");
	$late->query('COMMIT');
	is(errors_of($late), '42704', "mode $mode: a commit after drop_counter fails with 42704");
	is(sql("SELECT counter_value('d')"), '0', "mode $mode: the new counter reads 0");
	$late->quit;
	sql("SELECT sharded_seq.drop_counter('d')");
}

# flush_counters never waits for another session's alter_counter (each
# holds one counter's lock; flushing both would deadlock): each session's
# flush runs while the other holds its lock
sql("SELECT sharded_seq.create_counter('fa', mode => 'memcached'), sharded_seq.create_counter('fb', mode => 'memcached')");
my ($s1, $s2) = (session(), session());
$s1->query_safe("BEGIN; SELECT sharded_seq.alter_counter('fb', mode => 'exact');");
$s2->query_safe("BEGIN; SELECT sharded_seq.alter_counter('fa', mode => 'exact');");
$s1->query('SELECT sharded_seq.flush_counters();');
$s2->query('SELECT sharded_seq.flush_counters();');
$_->query('COMMIT') for $s1, $s2;
is(errors_of($s1) . errors_of($s2), '',
	'two sessions, each altering one counter, then flush_counters: no error, no wait');
$_->quit for $s1, $s2;

# 2b. prepared transactions hold the rows of four counters: the worker's
# flushes never wait for them, so another counter's amounts neither wait in
# shared memory nor sit in an uncommitted flush
reset_counts();
sql('CREATE TABLE ledger_h (delta int, at timestamptz DEFAULT clock_timestamp())');
sql("SELECT sharded_seq.create_counter('h', mode => 'memcached')");
for my $i (1 .. 4)
{
	sql("SELECT sharded_seq.create_counter('p$i', shards => 1, mode => 'memcached')");
	sql("SELECT counter_incr('p$i', 1)");
}
worker_round();
sql("BEGIN; SELECT counter_incr('p$_', 1); PREPARE TRANSACTION 'hold$_';") for 1 .. 4;
sql("SELECT counter_incr('p$_', 1)") for 1 .. 4;
# h's increments through three worker rounds
my $once = stop_point('h')
  . "BEGIN; SELECT counter_incr('h', 1) \\g /dev/null\nINSERT INTO ledger_h VALUES (1); COMMIT; SELECT pg_sleep(0.02) \\g /dev/null\n";
my $h = load_start($node, $db, 'h', $once x 5000);
worker_round() for 1 .. 3;
stop_load($node, $db, 'h');
no_errors($h, 'increments beside prepared transactions');
worker_round() for 1 .. 2;
$node->stop('immediate');
$node->start;
my ($total, $committed) = split /\|/, sql("SELECT counter_value('h'), (SELECT sum(delta) FROM ledger_h)");
note("RESULT four counters held by prepared transactions; another's increments, committed two worker rounds before an immediate shutdown: $total of $committed");
is($total, $committed, 'prepared transactions holding other rows kept no committed amount from memcached and the rows');
sql("ROLLBACK PREPARED 'hold$_'") for 1 .. 4;
worker_settled($node, $db);

# 3. memcached_batch_delay = 0: one request per commit
sub set_delay
{
	my ($delay) = @_;
	sql("ALTER SYSTEM SET sharded_seq.memcached_batch_delay = '$delay'; SELECT pg_reload_conf();");
	$node->poll_query_until($db,
		"SELECT setting::int = $delay FROM pg_settings WHERE name = 'sharded_seq.memcached_batch_delay'")
	  or die 'the setting did not take';
	return;
}
set_delay(0);
reset_counts();
$incr0 = mc_incrs();
my $p3 = load('p3', 4);
commits_above(1200);
stop_load($node, $db, 'p3');
no_errors($p3, 'unbatched');
$commits = sql('SELECT count(*) FROM ledger');
$incrs = mc_incrs() - $incr0;
note("RESULT with no delay, memcached took $incrs requests for $commits committed increments");
cmp_ok($incrs, '>=', $commits / 2, 'memcached_batch_delay = 0: about one memcached request per commit');
sql('SELECT sharded_seq.flush_counters()');
check('==', 'unbatched, after flush_counters');
set_delay(10);

# 4. an immediate shutdown under load, once more than 1000 was committed
# before a whole worker round
reset_counts();
my $p4 = load('p4', 8);
$node->poll_query_until($db, "SELECT coalesce(sum(delta), 0) > 1000 FROM ledger")
  or die 'the load stalled';
# what has committed by now (this snapshot's ledger), then a round that began later
my $floor = sql("SELECT sum(delta) FROM ledger WHERE counter IN ('m', 'm4')");
worker_round();
$node->stop('immediate');
my ($p4out, $p4err) = load_finish($p4);
is(scalar(grep { /connection|terminat/i } @$p4err), 8, 'the crash cut off every session mid-load');
$node->start;
check('<=', 'after an immediate shutdown');
$total = sql("SELECT sum(counter_value(name)) FROM sharded_seq.counters WHERE name IN ('m', 'm4')");
note("RESULT after an immediate shutdown: total $total, committed before the worker's last whole round $floor");
cmp_ok($floor, '>', 1000, 'enough was committed before that round (the test is not void)');
cmp_ok($total, '>=', $floor, 'the immediate shutdown lost nothing committed before the worker\'s last whole round');

# 5. memcached flush_all, then killed and restarted empty, under load, each
# once the load has used memcached since the one before
worker_settled($node, $db);
reset_counts();
my $p5 = load('p5', 8);
sub mc_used
{
	my $from = mc_incrs();
	# a wait that fails says what the worker and the counters saw meanwhile
	eval { poll_until(sub { mc_incrs() > $from }, 'memcached requests'); 1 } and return;
	my $why = $@;
	diag("memcached stats: " . join(', ', map { "$_=" . ($mc->stat_value($_) // '?') }
		qw(pid uptime curr_connections total_connections incr_hits incr_misses get_hits get_misses)));
	diag("sharded_seq.memcached_stats:\n" . $node->safe_psql($db, "SELECT * FROM sharded_seq.memcached_stats"));
	diag("sharded_seq.workers:\n" . $node->safe_psql($db, "SELECT * FROM sharded_seq.workers"));
	die $why;
}
mc_used();
is($mc->command('flush_all'), 'OK', 'flush_all under load');
mc_used();
my $misses = sql("SELECT sum(fallbacks + errors) FROM sharded_seq.memcached_stats WHERE name IN ('m', 'm4')");
$mc->kill('KILL');
$node->poll_query_until($db,
	"SELECT sum(fallbacks + errors) > $misses FROM sharded_seq.memcached_stats WHERE name IN ('m', 'm4')")
  or die 'the load did not notice memcached killed';
$mc->start;
mc_used();
is(load_running($p5), 8, 'the load ran through flush_all, the kill and the restart');
stop_load($node, $db, 'p5');
no_errors($p5, 'memcached flushed, killed and restarted');
sql('SELECT sharded_seq.flush_counters()');
check('<=', 'after flush_all and a memcached restart');
my $ledger;
($total, $ledger) = split /\|/, sql(
	"SELECT (SELECT sum(counter_value(name)) FROM sharded_seq.counters WHERE name IN ('m', 'm4')),
	        (SELECT coalesce(sum(delta), 0) FROM ledger WHERE counter IN ('m', 'm4'))");
note('RESULT memcached lost ' . ($ledger - $total) . " of $ledger committed");
cmp_ok($total, '>', 0, 'the counters counted');

# 6. memcached restarted while the worker's connection sat idle: the first
# amount the worker forwards after it is not lost on the closed connection
sql("SELECT sharded_seq.create_counter('r6', mode => 'memcached')");
sql("BEGIN; SELECT counter_incr('r6', 7); INSERT INTO ledger VALUES ('r6', 7); COMMIT;");
mc_used();
worker_round();
$mc->kill('TERM');
$mc->start;
my $r6_errors = sql("SELECT errors FROM sharded_seq.memcached_stats WHERE name = 'r6'");
sql("BEGIN; SELECT counter_incr('r6', 1000); INSERT INTO ledger VALUES ('r6', 1000); COMMIT;");
# two whole worker rounds: the worker has tried to forward it in between
worker_round();
worker_round();
sql('SELECT sharded_seq.flush_counters()');
my ($r6, $r6_ledger, $r6_errors_after) = split /\|/, sql(
	"SELECT counter_value('r6'), (SELECT sum(delta) FROM ledger WHERE counter = 'r6'),
	        (SELECT errors FROM sharded_seq.memcached_stats WHERE name = 'r6')");
note("RESULT after a restart of memcached the worker did not see: total $r6, ledger $r6_ledger, errors $r6_errors -> $r6_errors_after");
is($r6, $r6_ledger, 'memcached restarted behind the worker\'s idle connection: no amount lost');

done_testing();

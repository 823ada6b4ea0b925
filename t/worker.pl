# The background worker and mode 'buffered' (C2), on a server with
# sharded_seq preloaded and a real memcached.  Every committed increment also
# writes its delta to a ledger in the same transaction, so the ledger is what
# was committed:
#   1. pg_ctl restart -m fast under load, flush interval an hour: exact (only
#      the worker's flush at shutdown can have written the amounts);
#   2. a quiet counter is flushed within a few intervals, so an immediate
#      shutdown then loses nothing; the same for mode 'memcached' and
#      memcached's flush_all;
#   3. immediate shutdown under load: at most the committed sum, at least
#      what was committed before the worker's last whole round;
#   4. the worker alone killed with SIGKILL: it comes back, no total above
#      the ledger;
#   5. a full slot table: commits go to the rows, nothing is lost;
#   6. the worker's life: CREATE/DROP EXTENSION, CREATE DATABASE from its
#      database, a clone used only through the administration, DROP DATABASE
#      (and one refused), a prepared transaction holding one counter's row,
#      a round that fails, pg_terminate_backend;
#   7. no worker process free: commits go to the rows, a restart loses nothing;
#   8. the library taken out of shared_preload_libraries: no error, no
#      warning for its setting left behind, nothing lost.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use ShardedSeq::Node;
use ShardedSeq::Memcached;

my $mc = ShardedSeq::Memcached->new;
my $node = ssq_node(
	'worker',
	preload => 1,
	conf => "sharded_seq.memcached_servers = '" . $mc->servers . "'\n"
	  . "sharded_seq.counter_flush_interval = 1\n"
	  # the worker killed with SIGKILL is a crash: the server restarts
	  . "restart_after_crash = on\n"
	  # the loads' statements would fill the log
	  . "log_statement = none\n");
my $tmp = $PostgreSQL::Test::Utils::tmp_check;

sub sql { my ($sql, $db) = @_; return $node->safe_psql($db // 'stress', $sql); }

sub running
{
	my ($db) = @_;
	return $node->poll_query_until('stress',
		"SELECT coalesce(bool_or(running), false) FROM sharded_seq.workers WHERE database = '$db'");
}

# set_interval(SECONDS): the new flush interval, once the worker has done a
# round after the reload (the reload wakes it, and it reads its settings
# before the round; a whole round may be an hour away)
sub set_interval
{
	my ($s) = @_;
	my $t = sql("SELECT clock_timestamp()");
	sql("ALTER SYSTEM SET sharded_seq.counter_flush_interval = '$s'");
	sql("SELECT pg_reload_conf()");
	$node->poll_query_until('stress',
		"SELECT last_flush_at > '$t' FROM sharded_seq.workers WHERE database = 'stress'")
	  or die "the worker did no round after the reload";
	return;
}

sql(q{
SELECT sharded_seq.create_counter('buf', mode => 'buffered');
SELECT sharded_seq.create_counter('buf4', shards => 4, mode => 'buffered');
SELECT sharded_seq.create_counter('mc', mode => 'memcached');
CREATE TABLE ledger (counter text, delta bigint, at timestamptz DEFAULT clock_timestamp());
});
ok(running('stress'), 'a worker runs in database stress');

# script(TRANSACTIONS, SEED, NAMES): increments of 1 or 2 counters a
# transaction, each with its ledger row; 25% rolled back
sub script
{
	my ($n, $seed, @names) = @_;
	@names = qw(buf buf buf4) unless @names;
	srand($seed);
	my $out = '';
	for (1 .. $n)
	{
		my $sql = 'BEGIN;';
		for (1 .. (1, 1, 2)[ int(rand(3)) ])
		{
			my $d = int(rand(12)) - 2;
			my $c = $names[ int(rand(@names)) ];
			$sql .= " SELECT counter_incr('$c', $d); INSERT INTO ledger (counter, delta) VALUES ('$c', $d);";
		}
		$out .= $sql . (rand(100) < 25 ? " ROLLBACK;\n" : " COMMIT;\n");
	}
	return $out;
}

# load(NAME, SESSIONS, GENERATOR): that many psql sessions running what
# GENERATOR(session) returns, in the background; finish() waits for them
# and returns their stderr texts
sub load
{
	my ($name, $sessions, $gen) = @_;
	my @runs;
	for my $i (1 .. $sessions)
	{
		my $file = "$tmp/$name.$i.sql";
		PostgreSQL::Test::Utils::append_to_file($file, $gen->($i));
		my $err = '';
		my $r = IPC::Run::start(
			[
				$node->installed_command('psql'), '-XAtq', '-v', 'ON_ERROR_STOP=0',
				'-d', $node->connstr('stress'), '-f', $file
			],
			'>', '/dev/null', '2>', \$err);
		push @runs, [ $r, \$err ];
	}
	return \@runs;
}

sub finish
{
	my ($runs) = @_;
	$_->[0]->finish for @$runs;
	return map { ${ $_->[1] } } @$runs;
}

sub cut_off
{
	my ($what, @errs) = @_;
	my $n = grep { /connection|terminat/i } @errs;
	note("RESULT $what: $n of " . @errs . ' sessions were cut off');
	is($n, scalar @errs, "$what: every session was cut off mid-load (the test is not void)");
	return;
}

# check(OP, WHAT): every counter's total against its ledger, with OP
sub check
{
	my ($op, $what) = @_;
	for my $row (split /\n/, sql(q{
SELECT c.name, counter_value(c.name), (SELECT coalesce(sum(delta), 0) FROM ledger l WHERE l.counter = c.name),
       (SELECT count(*) FROM ledger l WHERE l.counter = c.name)
  FROM sharded_seq.counters c WHERE c.name IN ('buf', 'buf4') ORDER BY 1}))
	{
		my ($name, $total, $ledger, $rows) = split /\|/, $row;
		note("RESULT $what: counter $name total=$total ledger=$ledger committed increments=$rows");
		cmp_ok($total, $op, $ledger, "$what: ${name}'s total $op its ledger");
	}
	return;
}

sub reset_counters
{
	sql("TRUNCATE ledger; SELECT sharded_seq.flush_counters(); UPDATE sharded_seq.counter_shards SET value = 0");
	return;
}

###########################################################################
note('1. clean restart under load, nothing flushed before it');
set_interval(3600);
reset_counters();
is(sql("SELECT counter_value('buf') + counter_value('buf4')"), '0', 'the counters start at 0');
my $runs = load('p1', 8, sub { script(40000, 100 + $_[0]) });
$node->poll_query_until('stress',
	"SELECT sum(pending) > 1000 FROM sharded_seq.counters WHERE name IN ('buf', 'buf4')")
  or die 'nothing pending';
note('RESULT before the restart: '
	  . sql("SELECT sum(pending) FROM sharded_seq.counters WHERE name IN ('buf', 'buf4')")
	  . ' pending in shared memory');
$node->restart;
cut_off('p1', finish($runs));
check('==', 'after pg_ctl restart -m fast');
is(sql("SELECT sum(pending) FROM sharded_seq.counters"), '0', 'nothing pending after a clean restart');

###########################################################################
note('2. a quiet counter: flushed within a few intervals');
ok(running('stress'), 'a worker after the restart');
set_interval(1);
reset_counters();
finish(load('p2', 4, sub { script(300, 200 + $_[0]) }));
my $t0 = time;
# no time bound (a busy machine would fail it): the worker must flush a quiet
# counter with no further commit, within the test's timeout
ok( $node->poll_query_until('stress',
		"SELECT sum(pending) = 0 FROM sharded_seq.counters WHERE name IN ('buf', 'buf4')"),
	'a quiet buffered counter is flushed with no further commit');
my $took = time - $t0;
note(sprintf('RESULT a quiet buffered counter was flushed %.1f s after its last commit', $took));
$node->stop('immediate');
$node->start;
check('==', 'a quiet buffered counter after an immediate shutdown');

my $before = sql("SELECT counter_value('mc')");
sql(join '', map { "SELECT counter_incr('mc', 3);\n" } 1 .. 200);
$t0 = time;
ok($node->poll_query_until('stress', "SELECT pending = 0 FROM sharded_seq.counters WHERE name = 'mc'"),
	'a quiet memcached counter is flushed with no further commit');
$took = time - $t0;
note(sprintf('RESULT a quiet memcached counter was flushed %.1f s after its last commit', $took));
$mc->command('flush_all');
my $after = sql("SELECT counter_value('mc')");
note("RESULT a quiet memcached counter, then flush_all: $before -> $after (600 added)");
is($after, $before + 600, 'a quiet memcached counter loses nothing to flush_all');

###########################################################################
note('3. immediate shutdown under load');
reset_counters();
$runs = load('p3', 8, sub { script(100000, 300 + $_[0]) });
# more than 1000 committed, then a whole worker round under load
$node->poll_query_until('stress', "SELECT coalesce(sum(delta), 0) > 1000 FROM ledger")
  or die 'the load stalled';
# what has committed by now (this snapshot's ledger), then a round that began later
my $floor = sql("SELECT sum(delta) FROM ledger WHERE counter IN ('buf', 'buf4')");
worker_round($node, 'stress');
$node->stop('immediate');
cut_off('p3', finish($runs));
$node->start;
check('<=', 'after an immediate shutdown');
my $total = sql("SELECT sum(counter_value(name)) FROM sharded_seq.counters WHERE name IN ('buf', 'buf4')");
note("RESULT after an immediate shutdown: total $total, committed before the worker's last whole round $floor");
cmp_ok($floor, '>', 1000, 'enough was committed before that round (the test is not void)');
cmp_ok($total, '>=', $floor, 'the immediate shutdown lost nothing committed before the worker\'s last whole round');

###########################################################################
note('4. the worker killed with SIGKILL');
reset_counters();
ok(running('stress'), 'a worker after the crash');
$runs = load('p4', 8, sub { script(100000, 400 + $_[0]) });
$node->poll_query_until('stress',
	"SELECT (SELECT count(*) > 100 FROM ledger) AND (SELECT last_flush_amount > 0 FROM sharded_seq.workers WHERE database = 'stress')");
my $wpid = sql("SELECT pid FROM sharded_seq.workers WHERE database = 'stress'");
kill 'KILL', $wpid;
cut_off('p4', finish($runs));
$node->poll_query_until('stress', 'SELECT true');
check('<=', 'after the worker was killed');
$node->poll_query_until('stress',
	"SELECT coalesce(bool_or(running AND pid <> $wpid), false) FROM sharded_seq.workers WHERE database = 'stress'")
  or die 'no worker after SIGKILL';
my $newpid = sql("SELECT pid FROM sharded_seq.workers WHERE database = 'stress'");
note("RESULT the worker $wpid was killed; the server restarted it as $newpid");
isnt($newpid, $wpid, 'the server started the worker again after SIGKILL');

###########################################################################
note('5. a full slot table');
sql("ALTER SYSTEM SET sharded_seq.buffered_slots = 16");
$node->restart;
sql("TRUNCATE ledger");
sql("SELECT count(sharded_seq.create_counter('many_' || g, mode => 'buffered')) FROM generate_series(1, 40) g");
my @errs = finish(
	load(
		'p5', 4,
		sub {
			srand(500 + $_[0]);
			join '', map {
				my ($c, $d) = ('many_' . (1 + int(rand(40))), 1 + int(rand(5)));
				"BEGIN; SELECT counter_incr('$c', $d); INSERT INTO ledger (counter, delta) VALUES ('$c', $d); "
				  . (rand(100) < 20 ? "ROLLBACK;\n" : "COMMIT;\n")
			} 1 .. 400;
		}));
is(join('', @errs), '', 'no error with a full slot table');
my ($used, $slots, $refused) = split /\|/, sql("SELECT used, total, refused FROM sharded_seq.buffered_slots()");
note("RESULT slot table: $used of $slots used, $refused commits refused a slot");
cmp_ok($refused, '>', 0, 'the slot table filled (the test is not void)');
cmp_ok($used, '<=', $slots, 'no more slots used than exist');
sql("SELECT sharded_seq.flush_counters()");
note('RESULT 40 counters through 16 slots: totals and ledger '
	  . sql("SELECT sum(counter_value(c.name)) || ' ' || (SELECT sum(delta) FROM ledger) FROM sharded_seq.counters c WHERE c.name LIKE 'many_%'"));
is( sql("SELECT count(*) FROM (SELECT counter, sum(delta) s FROM ledger GROUP BY counter) l WHERE counter_value(l.counter) <> l.s"),
	'0', 'every counter of a full slot table is exact');
sql("ALTER SYSTEM RESET sharded_seq.buffered_slots");
$node->restart;

###########################################################################
note("6. the worker's life");
ok(running('stress'), 'a worker after the restart');
sql("CREATE DATABASE w2");
sql("CREATE EXTENSION sharded_seq", 'w2');
ok(running('w2'), 'CREATE EXTENSION starts a worker');
$t0 = time;
sql("CREATE DATABASE w3 TEMPLATE w2");
note(sprintf('RESULT CREATE DATABASE w3 TEMPLATE w2 took %d ms', (time - $t0) * 1000));
ok(running('w2'), 'the worker comes back after CREATE DATABASE from its database');
# a clone made after the launcher's start, used only through the
# administration (a view, flush_counters): that use alone gets it a worker
sql("SELECT count(*) FROM sharded_seq.counters", 'w3');
sql("SELECT sharded_seq.flush_counters()", 'w3');
ok(running('w3'), 'a clone used only through the counters view and flush_counters() gets its worker');

sub stopped
{
	my ($db) = @_;
	return $node->poll_query_until('stress',
		"SELECT NOT coalesce(bool_or(running), false) FROM sharded_seq.workers WHERE database = '$db'");
}
sql("DROP EXTENSION sharded_seq", 'w2');
ok(stopped('w2'), 'DROP EXTENSION stops the worker');
sql("CREATE EXTENSION sharded_seq; SELECT sharded_seq.create_counter('x', mode => 'buffered'); SELECT counter_incr('x', 5)", 'w2');
ok(running('w2'), 'CREATE EXTENSION again starts a worker again');
ok($node->poll_query_until('w2', "SELECT sum(value) = 5 FROM sharded_seq.counter_shards"),
	"the new worker flushes w2's counter");

# a role that may not drop the database stops its worker neither (the hook
# waits for the worker to be gone before the command goes on)
my $w2pid = sql("SELECT pid FROM sharded_seq.workers WHERE database = 'w2'");
sql("CREATE ROLE nobody_much LOGIN");
my ($rc, $out, $err) = $node->psql('stress', 'DROP DATABASE w2', extra_params => [ '-U', 'nobody_much' ]);
isnt($rc, 0, 'a role without rights cannot drop w2');
is(sql("SELECT pid FROM sharded_seq.workers WHERE database = 'w2'"), $w2pid,
	"... and its failed DROP DATABASE left w2's worker alone");

# DROP and CREATE EXTENSION in one session, the worker gone in between; then
# CREATE EXTENSION in a transaction block
my $s = $node->background_psql('w2');
$s->query_safe('DROP EXTENSION sharded_seq');
ok(stopped('w2'), 'DROP EXTENSION stops the worker');
$s->query_safe("CREATE EXTENSION sharded_seq; SELECT sharded_seq.create_counter('y', mode => 'buffered')");
ok(running('w2'), 'a worker after DROP and CREATE EXTENSION in one session');
$s->query_safe('DROP EXTENSION sharded_seq');
ok(stopped('w2'), 'DROP EXTENSION stops the worker');
$s->query_safe('BEGIN; CREATE EXTENSION sharded_seq');
is(sql("SELECT count(*) FROM sharded_seq.workers WHERE database = 'w2' AND running"), '0',
	'no worker while CREATE EXTENSION is not committed');
$s->query_safe("SELECT sharded_seq.create_counter('y', mode => 'buffered'); COMMIT");
$s->quit;
ok(running('w2'), 'a worker after CREATE EXTENSION in a transaction block');
sql("SELECT counter_incr('y', 9)", 'w2');
ok($node->poll_query_until('w2', "SELECT sum(value) = 9 FROM sharded_seq.counter_shards"),
	"w2's counter y is flushed");

# a dropped database's slots are freed
sql("SELECT counter_incr('y', 1)", 'w2');
my $used_before = sql("SELECT used FROM sharded_seq.buffered_slots()");
$t0 = time;
sql("DROP DATABASE w2");
note(sprintf('RESULT DROP DATABASE w2 took %d ms', (time - $t0) * 1000));
sql("DROP DATABASE w3");
ok($node->poll_query_until('stress', "SELECT used < $used_before FROM sharded_seq.buffered_slots()"),
	"the dropped database's slots are freed");
note("RESULT slots in use: $used_before before DROP DATABASE w2, "
	  . sql("SELECT used FROM sharded_seq.buffered_slots()") . ' after');

# a prepared transaction holding one counter's row holds up no other counter
sql("SELECT sharded_seq.create_counter('held', shards => 1, mode => 'buffered')");
sql("BEGIN; SELECT counter_incr('held', -1); PREPARE TRANSACTION 'holds_a_row'");
sql("SELECT counter_incr('held', 5), counter_incr('buf', 13)");
ok($node->poll_query_until('stress', "SELECT pending = 0 FROM sharded_seq.counters WHERE name = 'buf'"),
	"a prepared transaction holding another counter's row does not hold up the flush");
is(sql("SELECT pending FROM sharded_seq.counters WHERE name = 'held'"), '5',
	"held's amount waits in shared memory");
sql("COMMIT PREPARED 'holds_a_row'");
ok( $node->poll_query_until('stress',
		"SELECT pending = 0 AND total = 4 FROM sharded_seq.counters WHERE name = 'held'"),
	'held is flushed once its row is free');

# a round that fails: its error shows, and a later round flushes
sql("SELECT counter_incr('buf', 11)");
my $locker = $node->background_psql('stress');
$locker->query_safe('BEGIN; LOCK TABLE sharded_seq.counter_shards IN ACCESS EXCLUSIVE MODE');
ok( $node->poll_query_until('stress',
		"SELECT last_error IS NOT NULL FROM sharded_seq.workers WHERE database = 'stress'"),
	'a failed round leaves its error in the workers view');
note('RESULT the workers view shows: '
	  . sql("SELECT last_error FROM sharded_seq.workers WHERE database = 'stress'"));
$locker->query_safe('COMMIT');
$locker->quit;
ok($node->poll_query_until('stress', "SELECT pending = 0 FROM sharded_seq.counters WHERE name = 'buf'"),
	'a later round flushes');

$wpid = sql("SELECT pid FROM sharded_seq.workers WHERE database = 'stress'");
sql("SELECT counter_incr('buf', 1)");
$t0 = time;
sql("SELECT pg_terminate_backend($wpid)");
# no time bound (a busy machine would fail it): it must stop, within the
# test's timeout, rather than finish a round first
for (1 .. 20 * $PostgreSQL::Test::Utils::timeout_default)
{
	last unless kill 0, $wpid;
	usleep(50_000);
}
my $ms = int((time - $t0) * 1000);
note("RESULT the worker stopped $ms ms after SIGTERM");
ok(!kill(0, $wpid), 'the worker stops on SIGTERM');
ok( $node->poll_query_until('stress',
		"SELECT coalesce(bool_or(running AND pid <> $wpid), false) FROM sharded_seq.workers WHERE database = 'stress'"),
	'the launcher starts the worker again');

###########################################################################
note('7. no worker in the database: commits go to the rows');
# the logical replication launcher and ours take both worker processes
sql("ALTER SYSTEM SET max_worker_processes = 2");
my $log_at = -s $node->logfile;
$node->restart;
$node->wait_for_log(qr/could not start a worker for database/, $log_at);
is(sql("SELECT count(*) FROM sharded_seq.workers WHERE running AND kind = 'worker'"), '0',
	'no worker runs without a free process');
reset_counters();
finish(load('p6', 4, sub { script(300, 600 + $_[0]) }));
is(sql("SELECT coalesce(sum(pending), 0) FROM sharded_seq.counters"), '0',
	'with no worker, no amount waits in shared memory');
$node->restart;
check('==', 'with no worker, after pg_ctl restart -m fast');
sql("ALTER SYSTEM RESET max_worker_processes");
$node->restart;

###########################################################################
note('8. the library taken out of shared_preload_libraries');
reset_counters();
finish(load('p7', 4, sub { script(300, 700 + $_[0]) }));
# a later line wins; a setting of the preloaded library left behind
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = ''\nsharded_seq.buffered_slots = 1024\n");
$node->restart;
($rc, $out, $err) = $node->psql('stress', "SELECT counter_value('buf')");
unlike($err, qr/WARNING/, 'no session warns about sharded_seq.buffered_slots left in postgresql.conf');
is(sql('SHOW shared_preload_libraries'), '', 'no longer preloaded');
@errs = finish(load('p7b', 4, sub { script(300, 800 + $_[0]) }));
is(join('', @errs), '', 'no error once no longer preloaded');
check('==', 'after leaving shared_preload_libraries');
note('RESULT without preload the workers view says: ' . sql('SELECT last_error FROM sharded_seq.workers'));

# stopped here: Memcached.pm's END would leave its waitpid status as the exit code
$mc->kill;
done_testing();

# Transaction boundaries of mode 'memcached' that need a preloaded server, its
# worker and a real memcached (was test/stress/boundaries.sh parts 2-7):
#   C1/E2: nothing reaches memcached unless the commit is final; flushes in
#     rolled-back savepoints give back; PREPARE after a flush is refused;
#     flush_counters() needs rights and locks only counters with an amount;
#     alter to 'exact' strands nothing.
#   S1/S2: a lease published with a timed-out set is never used outside
#     memcached (a proxy, ShardedSeq/mcproxy.py, holds every SET reply).
#   S1/E6: DROP and CREATE EXTENSION: no memcached key of the old install is read.
#   C1: first commits to fresh memcached counters, all at once, lose nothing
#     and never leave the shared statistics' lock held.
#   C1/E3: memcached gone between a commit's decision and its delivery: the
#     amount goes to the rows with the next commit or at exit, never to a later
#     installation, and never makes another commit wait or fail.
# Every wait is on a condition; the only sleeps (pg_sleep(1.2)) outlast the
# code's one-second "memcached is down" interval, which a slow machine only
# lengthens.
use strict;
use warnings;
use FindBin;
use IPC::Run;
use Time::HiRes qw(usleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;
use ShardedSeq::Memcached;

my $mc = ShardedSeq::Memcached->new;
my $node = ssq_node(
	'bound',
	preload => 1,
	conf => "sharded_seq.memcached_servers = '" . $mc->servers . "'\n"
	  . "sharded_seq.counter_flush_interval = 3600\n");
# its first round flushes memcached counters; after it, an hour goes by
worker_settled($node, 'stress');
# nothing listens there: a commit finds memcached down only after committing
my $dead = '127.0.0.1:' . PostgreSQL::Test::Cluster::get_free_port();

sub sq { my ($sql, $db) = @_; return $node->safe_psql($db // 'stress', $sql); }

# a session of the test's; errors show as their SQLSTATE
sub session
{
	my ($db) = @_;
	my $s = $node->background_psql($db // 'stress', on_error_stop => 0);
	$s->query_safe('\set VERBOSITY sqlstate');
	$s->set_query_timer_restart;
	$s->{pid} = $s->query_safe('SELECT pg_backend_pid()');
	$s->{errors} = '';
	return $s;
}

# run(S, SQL): its output; in list context also the SQLSTATEs of its errors
# ('' if none).  S->{errors}: those of every statement S ran.
sub run
{
	my ($s, $sql) = @_;
	$s->{stderr} = '';
	my $out = $s->query($sql);
	my $codes = join ' ', $s->{stderr} =~ /(?:ERROR|FATAL|WARNING):\s+([0-9A-Z]{5})$/mg;
	$s->{stderr} = '';
	$s->{errors} .= $codes;
	return wantarray ? ($out, $codes) : $out;
}

# gone(S...): quit the sessions (their errors up to the end go to
# S->{errors}); true once their backends have exited
sub gone
{
	my (@s) = @_;
	my $pids = join ',', map { $_->{pid} } @s;
	for my $s (@s)
	{
		$s->quit;
		$s->{errors} .= join ' ', $s->{stderr} =~ /(?:ERROR|FATAL|WARNING):\s+([0-9A-Z]{5})$/mg;
	}
	return $node->poll_query_until('stress',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid IN ($pids)");
}

# psql_start(DB, SQL): psql running SQL from a file, one statement after
# another, in the background; psql_finish(RUN): its output, once it ended;
# dies with its errors
my $nfiles = 0;
sub psql_start
{
	my ($db, $sql) = @_;
	my $file = $PostgreSQL::Test::Utils::tmp_check . '/session_' . $nfiles++ . '.sql';
	append_to_file($file, $sql);
	# output to files: nothing pumps the pipes while the test does other work
	my %r = (out => "$file.out", err => "$file.err");
	$r{run} = IPC::Run::start(
		[ $node->installed_command('psql'), '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr($db), '-f', $file ],
		'>', $r{out}, '2>', $r{err},
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return \%r;
}

sub psql_finish
{
	my ($r) = @_;
	my $ok = $r->{run}->finish;
	my $err = slurp_file($r->{err});
	die "psql failed: $err" if !$ok || $err ne '';
	return slurp_file($r->{out});
}

# --- write-behind through memcached at transaction boundaries
sq("SELECT sharded_seq.create_counter('bA', shards => 4, mode => 'memcached')");
sq("SELECT counter_incr('bA', 10)") for 1 .. 3;
sub total { return sq("SELECT counter_value('bA')"); }
# the amount waiting in memcached: a read while the worker forwards a batch
# misses it for a moment (C2), so wait for the value expected
sub pending_is
{
	my ($want, $name) = @_;
	ok( $node->poll_query_until('stress',
			"SELECT pending FROM sharded_seq.counters WHERE name = 'bA'", $want),
		$name);
}
# a read may miss an amount a flush has in hand (C2, docs/write-behind.md):
# the three committed increments must come to 30, and a read never above it
ok( $node->poll_query_until('stress', "SELECT counter_value('bA')", '30'),
	'three committed increments count');
cmp_ok(total(), '<=', 30, 'no read counts an increment twice');
pending_is(30, '... and wait in memcached (all 30)');

my $A = session();
my $B = session();
my ($out, $err);
sq("SELECT sharded_seq.create_counter('eVictim')");
run($A, "BEGIN; SELECT counter_incr('bA', 5); SELECT counter_incr('eVictim', 1);");
sq("SELECT sharded_seq.drop_counter('eVictim')");
(undef, $err) = run($A, 'COMMIT;');
is($err, '42704', 'a commit that fails after its memcached increment was applied');
is(total(), 30, '... and the memcached increment does not count');

# SERIALIZABLE: the commit fails after the pre-commit callbacks
sq('CREATE TABLE skew (k int PRIMARY KEY, v int); INSERT INTO skew VALUES (1, 0), (2, 0)');
run($A, 'BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT sum(v) FROM skew; UPDATE skew SET v = 1 WHERE k = 1;');
run($B, "BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT sum(v) FROM skew; UPDATE skew SET v = 1 WHERE k = 2; SELECT counter_incr('bA', 5);");
(undef, $err) = run($A, 'COMMIT;');
is($err, '', 'write skew: the first SERIALIZABLE commit succeeds');
(undef, $err) = run($B, 'COMMIT;');
is($err, '40001', '... the second fails');
is(total(), 30, '... and its memcached increment does not count');

# two-phase commit
run($A, "BEGIN; SELECT counter_incr('bA', 7); PREPARE TRANSACTION 'bp1';");
sq("ROLLBACK PREPARED 'bp1'");
is(total(), 30, 'ROLLBACK PREPARED: the memcached increment does not count');
run($A, "BEGIN; SELECT counter_incr('bA', 7); PREPARE TRANSACTION 'bp2';");
sq("COMMIT PREPARED 'bp2'");
is(total(), 37, 'COMMIT PREPARED: it counts, once');

# flushes that are undone give back what they took
(undef, $err) = run($A,
	'BEGIN; SAVEPOINT s; SELECT sharded_seq.flush_counters(); ROLLBACK TO SAVEPOINT s; COMMIT;');
is($err, '', 'a flush in a rolled-back savepoint');
is(total(), 37, '... loses nothing');
pending_is(30, '... the amount is back in memcached');
(undef, $err) = run($A, "BEGIN; SELECT sharded_seq.flush_counters(); PREPARE TRANSACTION 'bp3';");
sq("ROLLBACK PREPARED 'bp3'") if $err eq '';
is($err, '0A000', 'PREPARE after a flush is refused');
is(total(), 37, '... and nothing is lost');

# flush_counters needs the right to increment
sq('CREATE ROLE thief LOGIN');
my $flushed = $node->safe_psql('stress',
	'BEGIN; SAVEPOINT s; SELECT sharded_seq.flush_counters(); ROLLBACK TO SAVEPOINT s; COMMIT;',
	extra_params => [ '-U', 'thief' ]);
is($flushed, '0', 'a role without rights on a counter flushes nothing');
is(total(), 37, '... and takes nothing from it');
pending_is(30, '... whose amount still waits in memcached');

# a flush locks only counters that have an amount to move
sq("SELECT count(sharded_seq.create_counter('quiet_' || g)) FROM generate_series(1, 300) g");
is( (split /\n/, sq("BEGIN; SELECT sharded_seq.flush_counters();
	   SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid(); ROLLBACK;"))[-1],
	1,
	'flush_counters() over 300 quiet counters and one with an amount holds one advisory lock');

# a transaction that incremented while in mode memcached commits after alter to exact
run($A, "BEGIN; SELECT counter_incr('bA', 3);");
sq("SELECT sharded_seq.alter_counter('bA', mode => 'exact')");
(undef, $err) = run($A, 'COMMIT;');
is($err, '', 'an increment made in mode memcached commits after alter to exact');
is(total(), 40, '... and counts');
# back in mode memcached, an amount stranded in memcached would count again
# (batched, the commit's amount waits in shared memory for the rows: no flush
# here, which would take a stranded amount out of memcached too)
sq("SELECT sharded_seq.alter_counter('bA', mode => 'memcached')");
is(total(), 40, '... and nothing is stranded in memcached: back in mode memcached it stays 40');
$A->quit;
$B->quit;

# --- a lease whose publication timed out
# No step depends on the machine's speed.  The proxy holds every SET reply
# for good (memcached has applied the SET), so a SET through it times out
# however long the timeout; every other reply it forwards.  A waits 5 s for
# those (and so 5 s for its SET); B, which publishes nothing, waits a minute.
# Each step waits on what the proxy reports or on a session's answer, never
# on a delay.
my $pport = PostgreSQL::Test::Cluster::get_free_port();
my $plog = "$PostgreSQL::Test::Utils::tmp_check/proxy.log";
my $proxy = IPC::Run::start(
	[ 'python3', "$FindBin::RealBin/ShardedSeq/mcproxy.py", $pport, $mc->port, 'never', '1' ],
	'>', $plog, '2>&1');
# proxy_said(PATTERN): wait until the proxy printed a line matching it
sub proxy_said
{
	my ($pattern) = @_;
	for (1 .. 10 * $PostgreSQL::Test::Utils::timeout_default)
	{
		return 1 if (slurp_file($plog) // '') =~ $pattern;
		usleep(100_000);
	}
	return 0;
}
ok(proxy_said(qr/^listening$/m), 'the proxy started');
sq("SELECT sharded_seq.create_sequence('mp', tier => 'memcached', block => 300)");
sub mp_stat { return sq("SELECT $_[0] FROM sharded_seq.memcached_stats WHERE name = 'mp'"); }
sub patient { return "SET sharded_seq.memcached_servers = '127.0.0.1:$pport'; SET sharded_seq.memcached_poll_timeout = '$_[0]';"; }
# A finds no lease, carves one and publishes it: memcached stores the SET,
# A sees a timeout.  A must then take values of that lease only through
# memcached's counter (or fall back to a block of its own), never directly.
$A = session();
run($A, patient('5s'));
my ($a_out, $a_err) = run($A, "SELECT sharded_nextval('mp');");
ok(proxy_said(qr/^held 1$/m), "A's lease publication (a SET) reached memcached");
is(mp_stat('errors >= 1'), 't', 'the first draw published a lease whose SET timed out');
# B finds the published lease and draws from it through memcached: had A
# used the lease directly, B's values would repeat A's.
$B = session();
run($B, patient('60s'));
my ($b_out, $b_err) = run($B, "SELECT sharded_nextval('mp') FROM generate_series(1, 30);");
is(mp_stat('hits >= 10'), 't', 'another session drew from that lease through memcached');
is($a_err . $b_err, '', '... without an error');
values_check('... and A and B drew no value twice', $a_out, $b_out);
$A->quit;
$B->quit;
# Then a load: 4 sessions with the default 200 ms timeout, whose SETs all
# time out while others draw.  Which path each draw takes depends on the
# machine (a busy proxy may time out other replies too); nothing here
# asserts one: whatever times out, no value may repeat (S1) nor go back (S2).
my @mp = map { psql_finish($_) } map {
	psql_start('stress',
		"SET sharded_seq.memcached_servers = '127.0.0.1:$pport';\n"
		  . ("SELECT sharded_nextval('mp') FROM generate_series(1, 20);\n" x 150))
} 1 .. 4;
$proxy->kill_kill;
is(scalar(() = join('', @mp) =~ /^\d+$/mg), 12000, '4 sessions drew 12000 values while every lease publication timed out, without an error');
values_check('... none twice, none out of order', @mp, $a_out, $b_out);
note('RESULT lease publications timed out: '
	  . mp_stat("'hits ' || hits || ', errors ' || errors || ', fallbacks ' || fallbacks"));

# --- DROP and CREATE EXTENSION with keys of the old install in memcached
ssq_db($node, 'reinstall');
worker_settled($node, 'reinstall');
my $objects = "SELECT sharded_seq.create_sequence('ms', tier => 'memcached', block => 200);
	SELECT sharded_seq.create_counter('bc', mode => 'memcached');";
sq($objects, 'reinstall');
my $old = sq("SELECT sharded_nextval('ms') FROM generate_series(1, 100)", 'reinstall');
sq("SELECT counter_incr('bc', 1)", 'reinstall');
sq("SELECT counter_incr('bc', 41)", 'reinstall');
# the worker forwards the amounts in batches: wait until they land in
# memcached (the old test gave this 10 s, and once failed on a loaded machine)
ok( $node->poll_query_until('reinstall',
		'SELECT coalesce(pending, 0) > 0 FROM sharded_seq.counters'),
	'the old install has an amount waiting in memcached');
sq('DROP EXTENSION sharded_seq CASCADE; CREATE EXTENSION sharded_seq', 'reinstall');
sq($objects, 'reinstall');
my @new = map { sq("SELECT sharded_nextval('ms') FROM generate_series(1, 150)", 'reinstall') } 1 .. 2;
values_check('the new install draws 300 values, unique and increasing', @new);
is(sq("SELECT counter_value('bc')", 'reinstall'), 0, "the new install's counter starts at zero");

# the same, when both installations came through version 1.0 and an update
sq('CREATE DATABASE via10', 'postgres');
sq("CREATE EXTENSION sharded_seq VERSION '1.0'", 'via10');
sq("SELECT sharded_seq.create_sequence('ms', tier => 'memcached', block => 1000)", 'via10');
sq("SELECT sharded_nextval('ms') FROM generate_series(1, 5)", 'via10');
sq("DROP EXTENSION sharded_seq CASCADE; CREATE EXTENSION sharded_seq VERSION '1.0'; ALTER EXTENSION sharded_seq UPDATE",
	'via10');
is(sq('SELECT token <> 0 FROM sharded_seq.installation', 'via10'), 't',
	'an update from 1.0 with nothing in memcached draws a token of its own');
sq("SELECT sharded_seq.create_sequence('ms2', tier => 'memcached', block => 1000)", 'via10');
my @via10 = (
	sq("SELECT sharded_nextval('ms2') FROM generate_series(1, 5)", 'via10'),
	sq("SET sharded_seq.memcached_servers = '$dead'; SELECT sharded_nextval('ms2') FROM generate_series(1, 20)",
		'via10'));
values_check('... its values, through memcached and without it, unique and increasing', @via10);

# --- first commits to fresh memcached counters, all at once
# Each of 8 sessions commits its increment of counter k the moment D lets go
# of lock k, so that first commits (and first statistics events) collide.
my $N = 150;
sq("SELECT count(sharded_seq.create_counter('r_' || g, shards => 2, mode => 'memcached')) FROM generate_series(1, $N) g");
my $D = session();
run($D, "SELECT count(pg_advisory_lock(g)) FROM generate_series(1, $N) g");
my @racers = map {
	psql_start('stress', join '',
		map { "BEGIN; SELECT counter_incr('r_$_'); SELECT pg_advisory_xact_lock_shared($_); COMMIT;\n" } 1 .. $N)
} 1 .. 8;
# lock k goes once all 8 wait on it: a lock left held would stop them (and D)
(undef, $err) = run($D, "DO \$\$ BEGIN FOR k IN 1 .. $N LOOP
	WHILE (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = k AND NOT granted) < 8
	LOOP PERFORM pg_sleep(0.01); END LOOP;
	PERFORM pg_advisory_unlock(k); END LOOP; END \$\$;");
is($err, '', "8 sessions reached each of $N rounds");
$D->quit;
psql_finish($_) for @racers;
pass('... and ended without an error');
is(sq('SELECT count(*) > 0 FROM sharded_seq.memcached_stats'), 't',
	'no session hung, and the statistics can be read');
# an increment reaches memcached a moment after its commit returned (sent
# without waiting for a reply)
ok( $node->poll_query_until('stress',
		"SELECT sum(counter_value('r_' || g)) FROM generate_series(1, $N) g", 8 * $N),
	"8 sessions x $N fresh counters, committed at once: every increment counts");
sq('SELECT sharded_seq.flush_counters()');
is( sq("SELECT sum(counter_value('r_' || g)) || ' ' || sum(pending) FROM generate_series(1, $N) g, sharded_seq.counters c WHERE c.name = 'r_' || g"),
	8 * $N . ' 0', '... and still after a flush to the rows');

# --- memcached gone after the commit decided to use it
sq("SELECT sharded_seq.create_counter('lb', mode => 'memcached')");
my $L = session();
run($L, "SET sharded_seq.memcached_servers = '$dead';");
# the read inside counter_incr finds memcached down; 1.2 s later the commit
# no longer knows it, chooses memcached, and finds it down after commit
sub leftover
{
	my ($s, $counter, $n) = @_;
	return run($s, "BEGIN; SELECT counter_incr('$counter', $n); SELECT pg_sleep(1.2); COMMIT;");
}
leftover($L, 'lb', 5);
is(sq("SELECT counter_value('lb')"), 0,
	'an amount that found memcached gone after its commit is not in the rows yet');
is(run($L, "SELECT counter_value('lb')"), 5, '... but the committing session counts it');
run($L, "SELECT counter_incr('lb', 7);");
is(sq("SELECT counter_value('lb')"), 12, 'its next commit writes the rows, with the earlier amount');
leftover($L, 'lb', 3);
is(sq("SELECT counter_value('lb')"), 12, 'another amount left over');
sq("SELECT sharded_seq.alter_counter('lb', mode => 'exact')");
ok(gone($L), 'the session exits');
is(sq("SELECT counter_value('lb')"), 15,
	'an amount left when the session ends is written to the rows at exit, after a switch to exact');
is(sq("SELECT sharded_seq.counter_pending(id) FROM sharded_seq.counter_config WHERE name = 'lb'"), 0,
	'... with nothing in memcached');
is($L->{errors}, '', '... and no error in that session');

# a leftover never holds up or fails another commit: not when its rows are
# held by another transaction, not when its counter cannot take it.  A wait
# would stop the test here (no lock_timeout stands in for it).
sq("SELECT sharded_seq.create_counter('held', shards => 1, mode => 'memcached'), sharded_seq.create_counter('full', shards => 1, mode => 'memcached'), sharded_seq.create_counter('other')");
$L = session();
run($L, "SET sharded_seq.memcached_servers = '$dead';");
# one counter a transaction: the first delivery attempt tells the second
# that memcached is down
leftover($L, 'held', 5);
leftover($L, 'full', 1000);
sq("SELECT counter_incr('full', 9223372036854775000)");
my $H = session();
my $hold = "BEGIN; UPDATE sharded_seq.counter_shards SET value = value WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = 'held');";
run($H, $hold);
run($L, "SELECT counter_incr('other', 1);");
is($L->{errors}, '', 'a commit whose leftovers\' rows are held, or cannot take them, neither waits nor fails');
is(sq("SELECT counter_value('other')"), 1, '... and counts its own increment');
run($H, 'ROLLBACK;');
(undef, $err) = run($L, "SELECT counter_incr('other', 1);");
is(sq("SELECT counter_value('held')"), 5, 'the held leftover goes to the rows with a later commit');
is(sq("SELECT counter_value('full')") . " $L->{errors}", '9223372036854775000 ',
	'... and the one that cannot fit is dropped, not retried forever');
# exit does not wait for held rows (it gives up after about a second)
leftover($L, 'held', 4);
run($H, $hold);
ok(gone($L), 'a session whose leftover\'s rows are held still exits');
run($H, 'ROLLBACK;');
$H->quit;

# a leftover never reaches a counter of a later installation
ssq_db($node, 'leftover');
sq("SELECT sharded_seq.create_counter('old_c', mode => 'memcached')", 'leftover');
my $M = session('leftover');
run($M, "SET sharded_seq.memcached_servers = '$dead';");
leftover($M, 'old_c', 5);
sq('DROP EXTENSION sharded_seq CASCADE; CREATE EXTENSION sharded_seq', 'leftover');
sq("SELECT sharded_seq.create_counter('victim')", 'leftover');
is(sq("SELECT id FROM sharded_seq.counter_config WHERE name = 'victim'", 'leftover'), 1,
	"the new installation's counter has the old one's id");
is(run($M, "SELECT counter_value('victim')"), 0,
	"... is not given the old installation's leftover, in that session");
run($M, "SELECT pg_sleep(1.2); SELECT counter_incr('mine', 1);");
ok(gone($M), '... which exits');
is(sq("SELECT counter_value('victim')", 'leftover'), 0,
	'... nor in its rows, after a commit and the session\'s exit');

# --- amounts left over never make another commit wait or fail
sq("SELECT sharded_seq.create_counter('c1', shards => 1, mode => 'memcached'), sharded_seq.create_counter('e1', shards => 1)");
sq('CREATE TABLE y (i int)');
my $S = session();
run($S, "SET sharded_seq.memcached_servers = '$dead';");
leftover($S, 'c1', 5);
$H = session();
run($H, "BEGIN; SELECT 1 FROM sharded_seq.counter_shards WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = 'c1') FOR UPDATE;");
leftover($S, 'c1', 7);    # its commit finds the first one's rows held
run($H, 'COMMIT;');
run($S, "SELECT pg_sleep(1.2); SELECT counter_incr('e1', 1);");
is(sq("SELECT counter_value('c1')"), 12,
	'two amounts of one counter left over while its rows were held both count');
leftover($S, 'c1', 1);
run($H, 'BEGIN; LOCK TABLE sharded_seq.counter_shards IN SHARE MODE;');
run($S, "SELECT pg_sleep(1.2); SELECT counter_incr('c1', 0), counter_incr('e1', 0);");
is($S->{errors}, '', 'a commit with a leftover does not wait for a table lock on the shard rows');
run($H, 'COMMIT;');
leftover($S, 'c1', 2);
run($H, "BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT counter_value('c1'); INSERT INTO y VALUES (1);");
run($S, "SELECT pg_sleep(1.2); BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT count(*) FROM y; SELECT counter_incr('e1', 1);");
run($H, 'COMMIT;');
run($S, 'COMMIT;');
is($S->{errors}, '', 'a SERIALIZABLE commit does not fail because of a leftover');
run($S, "SELECT counter_incr('e1', 1);");
is(sq("SELECT counter_value('c1') || ' ' || counter_value('e1')"), '15 3', '... which a later commit writes');
ssq_db($node, 'dropping');
sq("SELECT sharded_seq.create_counter('c', mode => 'memcached'), sharded_seq.create_counter('e')", 'dropping');
my $D2 = session('dropping');
run($D2, "SET sharded_seq.memcached_servers = '$dead';");
leftover($D2, 'c', 5);
run($D2, "SELECT pg_sleep(1.2); BEGIN; SELECT counter_incr('e', 1); DROP EXTENSION sharded_seq CASCADE; COMMIT;");
is($D2->{errors} . ' ' . sq("SELECT count(*) FROM pg_extension WHERE extname = 'sharded_seq'", 'dropping'), ' 0',
	'DROP EXTENSION commits in a transaction with counter work and a leftover');
ok(gone($D2, $S, $H), 'the sessions exit');
is(sq("SELECT counter_value('c1')"), 15, '... and nothing was counted twice or lost');

done_testing();

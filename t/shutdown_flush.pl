# C2: a clean shutdown (pg_ctl stop -m fast) loses no committed increment of
# a write-behind counter in shared memory, whatever the timing of the
# commits and flushes around it.  The server preloads sharded_seq, with the
# flush interval an hour: only the worker's flush at shutdown writes the
# rows.  Each committed increment also writes its delta to a ledger in the
# same transaction; after each restart every counter equals its ledger.
#   1. a commit held at wait point slot-reserve-unpinned (it asked whether
#      the worker takes amounts, not yet pinned: the gap of issue 18) while
#      the server stops; let go once the worker has exited;
#   2. a commit held at slot-reserved (pinned, before its commit), 'buffered'
#      and 'memcached' batched through shared memory: the worker must wait
#      for it however long it is held;
#   3. a flush_counters() held at buffered-flush-taken (it took a slot's
#      amount), its transaction then ended by the shutdown, which gives the
#      amount back: the worker must wait for it too;
#   4. sessions commit increments (a one-shard counter among them, whose
#      single row a commit that goes to the rows holds) while the server
#      stops, five rounds.
# A held backend is frozen through the stop as a debugger would: SIGSTOP at
# the wait point, the point let go, pg_ctl stop, SIGCONT once the worker has
# exited or says it waits.
use strict;
use warnings;
use IPC::Run;
use Time::HiRes qw(usleep);
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
	  . "sharded_seq.counter_flush_interval = 3600\n");
worker_settled($node, 'stress');
$node->safe_psql('stress', q{
SELECT sharded_seq.create_counter('b', mode => 'buffered');
SELECT sharded_seq.create_counter('b1', shards => 1, mode => 'buffered');
SELECT sharded_seq.create_counter('m', mode => 'memcached');
CREATE TABLE ledger (counter text, delta bigint);
});

sub sql { return $node->safe_psql('stress', $_[0]); }

sub restart_after_stop
{
	$node->start;
	worker_settled($node, 'stress');
	return;
}

# held(TAG, POINT, SETUP_SQL, HELD_SQL, WANT): a session runs SETUP_SQL,
# then HELD_SQL, which stops at wait point POINT; it is frozen there while
# the server stops -m fast, and let go when the worker has exited (WANT
# 'exited') or logs that it waits for a pinned slot (WANT 'waited').
sub held
{
	my ($tag, $point, $setup, $sql, $want) = @_;
	my $s = $node->background_psql('stress', on_error_stop => 0);
	$s->query_safe($setup) if $setup;
	my $pid = $s->query_safe('SELECT pg_backend_pid()');
	my $wpid = sql("SELECT pid FROM sharded_seq.workers WHERE database = 'stress' AND running");
	ok($wpid, "$tag: the worker runs");
	my $hold = wait_point_hold($node, 'stress', $point, $pid);
	$s->query_until(qr/sent/, "\\echo sent\n$sql\n");
	is(wait_point_reached($node, 'stress', $point), $pid, "$tag: the session waits at $point");
	kill 'STOP', $pid;
	wait_point_release($hold);

	my $offset = -s $node->logfile;
	my ($out, $err) = ('', '');
	my $stop = IPC::Run::start(
		[ 'pg_ctl', '-D', $node->data_dir, '-m', 'fast', '-w', 'stop' ],
		'>', \$out, '2>', \$err);
	my $seen = '';
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while (time < $deadline)
	{
		if (slurp_file($node->logfile, $offset) =~ /waits for \d+ slots .* before its last flush/)
		{
			$seen = 'waited';
			last;
		}
		if (!kill 0, $wpid)
		{
			$seen = 'exited';
			last;
		}
		usleep(50_000);
	}
	kill 'CONT', $pid;
	ok($stop->finish, "$tag: pg_ctl stop -m fast") or diag($err);
	$node->_update_pid(0);
	# its server has gone: psql may have exited already
	eval { $s->quit; };
	is($seen, $want, "$tag: held at $point through the stop, the worker $want");
	note("RESULT $tag: held at $point through pg_ctl stop -m fast, let go when the worker $seen");
	restart_after_stop();
	return;
}

# 1. a commit held between asking whether the worker takes amounts and its pin
sql("BEGIN; INSERT INTO ledger VALUES ('b', 1); SELECT counter_incr('b', 1); COMMIT;");
held('pin', 'slot-reserve-unpinned', '',
	"BEGIN; INSERT INTO ledger VALUES ('b', 7); SELECT counter_incr('b', 7); COMMIT;", 'exited');
note("RESULT pin: the held commit "
	  . (sql("SELECT count(*) FROM ledger WHERE counter = 'b'") == 2 ? 'committed' : 'was rolled back'));
ledger_check($node, 'stress', 'a commit held before its pin');

# 2. a commit held after it reserved (pinned) its slot
for my $c ('b', 'm')
{
	held("reserved_$c", 'slot-reserved', '',
		"BEGIN; INSERT INTO ledger VALUES ('$c', 5); SELECT counter_incr('$c', 5); COMMIT;", 'waited');
	ledger_check($node, 'stress', "a '$c' commit held after its reservation");
}

# 3. a flush_counters() held after it took an amount
sql("BEGIN; INSERT INTO ledger VALUES ('b', 11); SELECT counter_incr('b', 11); COMMIT;");
is(sql("SELECT pending FROM sharded_seq.counters WHERE name = 'b'"), '11',
	"b's amount waits in shared memory");
held('flush', 'buffered-flush-taken', '', 'BEGIN; SELECT sharded_seq.flush_counters();', 'waited');
ledger_check($node, 'stress', 'a flush_counters() held after its take, ended by the shutdown');

# 4. sessions commit increments of the three counters (20% rolled back)
# while the server stops
sub load_script
{
	my ($seed) = @_;
	srand($seed);
	my @names = ('b', 'b', 'b1', 'm');
	my $sql = '';
	for (1 .. 100000)
	{
		$sql .= 'BEGIN;';
		for (1 .. 1 + int(rand(2)))
		{
			my $name = $names[ int(rand(@names)) ];
			my $d = 1 + int(rand(9));
			$sql .= " INSERT INTO ledger VALUES ('$name', $d); SELECT counter_incr('$name', $d);";
		}
		$sql .= rand(100) < 20 ? " ROLLBACK;\n" : " COMMIT;\n";
	}
	return $sql;
}

for my $round (1 .. 5)
{
	my $rows = sql('SELECT count(*) FROM ledger');
	my $load = load_start($node, 'stress', "r$round",
		map { load_script($round * 100 + $_) } 1 .. 4);
	$node->poll_query_until('stress', "SELECT count(*) >= $rows + 300 FROM ledger")
	  or die "round $round: the load did not start";
	my $pending = sql('SELECT coalesce(sum(pending), 0) FROM sharded_seq.counters');
	$node->stop('fast');
	is(load_cut_off($load), 4, "round $round: the stop cut every session off mid-load");
	note("RESULT round $round: $pending pending in shared memory as the server stopped");
	cmp_ok($pending, '>', 0, "round $round: increments were pending in shared memory");
	restart_after_stop();
	ledger_check($node, 'stress', "round $round");
}

# stopped here, not in its DESTROY, whose wait would set the exit status
$mc->kill;
done_testing();

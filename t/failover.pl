# S1 across failover to a synchronous standby.  A primary streams to a
# standby named in synchronous_standby_names ('*', synchronous_commit = on).
# Sessions open transactions that stay open and draw a few values while the
# standby keeps up, then the standby's WAL receiver is stopped (SIGSTOP) and
# they ask for 300 more each from a database-tier sequence and a
# memcached-tier one, and from a native sequence for comparison.  Waits are
# cancelled (statement_timeout, pg_cancel_backend) and one terminated.  Then
# the primary crashes, the stalled receiver is killed with what it had not
# read, the standby is promoted and draws past everything handed out before.
# No sharded value may come back; native nextval must (else the scenario did
# not bite); a cancelled wait must raise an error and hand out nothing, and a
# wait released by emptying synchronous_standby_names hands out its block.
use strict;
use warnings;
use Time::HiRes qw(gettimeofday tv_interval);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;
use ShardedSeq::Memcached;

my %count = (s => 8, m => 4, n => 2);	# database tier, memcached tier, native
my $before_n = 25;						# values each draws while the standby keeps up
my $stalled_n = 300;					# values each asks for while it is stalled

my $mc = ShardedSeq::Memcached->new;
my $primary = ssq_node(
	'primary',
	preload => 1,
	allows_streaming => 1,
	conf => "sharded_seq.memcached_servers = '" . $mc->servers . "'\n"
	  . "synchronous_commit = on\nwal_sender_timeout = 0\n"
	  # the standby (a copy) restarts when its WAL receiver is killed
	  . "restart_after_crash = on\n");
# one shard each: one session's draws on the promoted node then cover every
# block the old primary carved.  's' keeps a block per session (cache
# 'session'): each session waits for its own block here; the node cache
# (one reservation that the others wait for) is failed over in
# t/node_cache.pl.
$primary->safe_psql('stress', q{
SELECT sharded_seq.create_sequence('s', shards => 1, block => 20, cache => 'session');
SELECT sharded_seq.create_sequence('m', tier => 'memcached', block => 10);
CREATE SEQUENCE native_s;
});

# blocks of 20 from one shard: a WAL record reserves 32 blocks ahead, so
# about one block in 32 writes WAL and waits
sub timed
{
	my $t0 = [gettimeofday];
	$primary->safe_psql('stress', "SELECT count(sharded_nextval('s')) FROM generate_series(1, 20000)");
	return int(tv_interval($t0) * 1000);
}
my $no_sync_ms = timed();

# the standby; synchronous_standby_names is set after the base backup: the
# promoted standby must not wait for anyone
my $standby = sync_standby($primary);
my $sync_ms = timed();
note("RESULT 20000 values in 1000 blocks: $no_sync_ms ms with synchronous_standby_names empty, "
	  . "$sync_ms ms with a synchronous standby (each with a psql start)");

# session(NODE, NAME): a session named NAME, its errors with their SQLSTATE
sub session
{
	my ($node, $name) = @_;
	my $h = $node->background_psql('stress', on_error_stop => 0);
	$h->query_safe("\\set VERBOSITY verbose\nSET application_name = '$name'");
	return $h;
}

# send_sql(SESSION, SQL): SQL sent, not waited for; what it printed at once
sub send_sql
{
	my ($h, $sql) = @_;
	my $out = $h->query_until(qr/^sent\n/m, "\\echo sent\n$sql\n");
	$out =~ s/^sent\n//m;
	return $out;
}

sub draw_sql
{
	my ($name, $n) = @_;
	my $call =
	    $name =~ /^s/ ? "sharded_nextval('s')"
	  : $name =~ /^m/ ? "sharded_nextval('m')"
	  :                 "nextval('native_s')";
	return "SELECT $call;\n" x $n;
}

# sessions open transactions and draw while the standby keeps up
my @names = map { my $k = $_; map { "$k$_" } 1 .. $count{$k} } qw(s m n);
my (%h, %got, %before);
for my $n (@names)
{
	$h{$n} = session($primary, $n);
	$h{$n}->query_safe('BEGIN');
	$got{$n} = $h{$n}->query_safe(draw_sql($n, $before_n));
	$before{$n} = () = $got{$n} =~ /^-?\d+$/mg;
}

# everything so far is on the standby, and a checkpoint makes the next
# reservation of every sequence write WAL of its own
$primary->safe_psql('stress', 'CHECKPOINT');
$primary->wait_for_catchup($standby, 'flush', $primary->lsn('flush'));
my $walrcv = $standby->safe_psql('postgres', 'SELECT pid FROM pg_stat_wal_receiver');
ok($walrcv, 'the standby has a WAL receiver');
kill 'STOP', $walrcv;
$got{$_} .= "\n" . send_sql($h{$_}, draw_sql($_, $stalled_n)) for @names;

# every session has finished its draws or waits
my $ours = "state = 'active' AND application_name ~ '^[smnc][0-9]+\$'";
$primary->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM pg_stat_activity WHERE $ours
	    AND wait_event IS DISTINCT FROM 'SyncRep' AND wait_event_type IS DISTINCT FROM 'Lock'")
  or die 'the sessions neither finished nor waited';
note('RESULT sessions stalled: ' . $primary->safe_psql('postgres',
	"SELECT count(*) FILTER (WHERE wait_event = 'SyncRep') || ' waiting for the standby, '
	        || count(*) FILTER (WHERE wait_event_type = 'Lock') || ' behind a lease rebuild'
	   FROM pg_stat_activity WHERE $ours"));

# waiting(NAME): whether session NAME waits for the standby, once it does
sub waiting
{
	my ($name) = @_;
	return $primary->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = '$name' AND wait_event = 'SyncRep'");
}

# statement_timeout ends c1's waits, in and out of a transaction
my $c1 = session($primary, 'c1');
$c1->query("SET statement_timeout = '1s'");
my $c_out = $c1->query("BEGIN; SELECT sharded_nextval('s');");
$c_out .= $c1->query("ROLLBACK; SELECT sharded_nextval('s');");
my $c1_errors = () = $c1->{stderr} =~ /ERROR:  57014/g;
is($c1_errors, 2, 'c1: both waits ended by statement_timeout raise 57014');

# c2 waits; the wait is cancelled; its next call must wait again, not use
# the block whose wait was cancelled
my $c2 = session($primary, 'c2');
$c_out .= send_sql($c2, "SELECT sharded_nextval('s');");
ok(waiting('c2'), 'c2 waits for the standby');
$primary->safe_psql('postgres',
	"SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'c2'");
$c_out .= send_sql($c2, "SELECT sharded_nextval('s');");
ok(waiting('c2'), 'c2 waits again after its wait was cancelled');

# a memcached-tier session waiting on its new lease (the others wait for
# its rebuild lock) is cancelled: the lease is not published, and the next
# session to take the lock carves another one and waits in turn
my $mwait = "SELECT application_name FROM pg_stat_activity
              WHERE application_name ~ '^m[0-9]+\$' AND wait_event = 'SyncRep'";
my $mcancelled = $primary->safe_psql('postgres', $mwait);
like($mcancelled, qr/^m\d+$/, 'a memcached-tier session waits on its new lease');
$primary->safe_psql('postgres',
	"SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = '$mcancelled'");
ok( $primary->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM ($mwait) w WHERE application_name <> '$mcancelled'"),
	"another memcached-tier session waits on a new lease once $mcancelled was cancelled");

# a termination during the wait ends that session only: no crash restart
$primary->safe_psql('postgres',
	"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'c2'");
ok( $primary->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = 'c2'"),
	'c2 ends when terminated during its wait');
is( $primary->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE application_name ~ '^s[0-9]+\$' AND wait_event = 'SyncRep'"),
	$count{s}, 'every database-tier session still waits: no crash restart');

# the primary crashes; the stalled WAL receiver is killed; the standby is
# promoted.  Each session's psql ends with its connection and prints the rest.
$primary->stop('immediate');
kill 'KILL', $walrcv;
kill 'CONT', $walrcv;
for my $h (values %h, $c2)
{
	eval { $h->{run}->finish; };
}
$got{$_} .= "\n" . $h{$_}{stdout} for @names;
$c_out .= $c2->{stdout};
eval { $c1->quit; };
my $c2_errors = () = $c2->{stderr} =~ /ERROR:  57014/g;
is($c2_errors, 1, 'c2: its cancelled wait raised 57014');
my $m_errors = () = $h{$mcancelled}{stderr} =~ /ERROR:  57014/g;
is($m_errors, 1, "$mcancelled: its cancelled wait on a new lease raised 57014");
my $c_values = () = $c_out =~ /^-?\d+$/mg;
is($c_values, 0, 'the cancelled and timed-out waits handed out no value');

$standby->poll_query_until('postgres', 'SELECT true');
$standby->promote;
is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 'f', 'the standby was promoted');

# what each kind of session received before the crash, and during the stall
my %pre;
for my $n (@names)
{
	my @v = $got{$n} =~ /^(-?\d+)$/mg;
	my $k = substr($n, 0, 1);
	push @{ $pre{$k} }, @v;
	$pre{"stalled_$k"} += @v - $before{$n};
}
note("RESULT received while the standby was stalled: "
	  . ($pre{stalled_s} // 0) . " of " . $count{s} * $stalled_n . " database-tier, "
	  . ($pre{stalled_m} // 0) . " of " . $count{m} * $stalled_n . " memcached-tier, "
	  . ($pre{stalled_n} // 0) . " of " . $count{n} * $stalled_n . " native");

# draw past everything the old primary could have handed out
my $all = $before_n + $stalled_n;
my %post = (
	s => $standby->safe_psql('stress',
		"SELECT sharded_nextval('s') FROM generate_series(1, " . ($count{s} + 2) * $all * 2 . ")"),
	m => $standby->safe_psql('stress',
		"SELECT sharded_nextval('m') FROM generate_series(1, " . ($count{m} * $all * 2 + 1000) . ")"),
	n => $standby->safe_psql('stress',
		"SELECT nextval('native_s') FROM generate_series(1, " . $count{n} * $all * 2 . ")"));

# like a commit, a wait ends without an error when synchronous_standby_names
# is emptied: the promoted node names a standby it does not have, then not
$standby->safe_psql('postgres',
	"ALTER SYSTEM SET synchronous_standby_names = '*'; SELECT pg_reload_conf()");
$standby->poll_query_until('postgres', "SELECT current_setting('synchronous_standby_names') = '*'");
my $r1 = session($standby, 'r1');
my $r1_out = send_sql($r1, "SELECT sharded_nextval('s') FROM generate_series(1, 100);");
my $r1_waited = $standby->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'r1' AND wait_event = 'SyncRep'");
ok($r1_waited, 'with a standby named but absent, a draw waits');
$standby->safe_psql('postgres',
	'ALTER SYSTEM RESET synchronous_standby_names; SELECT pg_reload_conf()');
my ($rest, $r1_err) = $r1->query('SELECT 1 WHERE false');
$r1_out .= $rest;
$r1->quit;
my $r1_values = () = $r1_out =~ /^\d+$/mg;
note("RESULT released: with a standby named but absent the draw waited "
	  . ($r1_waited ? 'yes' : 'no')
	  . "; emptying synchronous_standby_names released it with $r1_values of 100 values and "
	  . ($r1_err ? 'errors' : 'no errors'));
is($r1_values, 100, 'emptying synchronous_standby_names releases the wait with its block');
is($r1->{stderr}, '', 'and no error');
$post{s} .= "\n$r1_out";

for my $k ('s', 'm', 'n')
{
	my $label = { s => 'database tier', m => 'memcached tier', n => 'native nextval' }->{$k};
	my @pre = @{ $pre{$k} };
	my @post = $post{$k} =~ /^(-?\d+)$/mg;
	my %seen = map { $_ => 1 } @pre;
	my $reissued = grep { $seen{$_} } @post;
	my $twice_before = @pre - keys %seen;
	my ($max_pre) = sort { $b <=> $a } @pre;
	my ($max_post) = sort { $b <=> $a } @post;
	note("RESULT $label: " . scalar(@pre) . " values handed out before the failover, $reissued handed out again "
		  . "by the promoted standby (it drew " . scalar(@post) . ", up to $max_post; the old primary's highest was $max_pre)");
	if ($k eq 'n')
	{
		cmp_ok($reissued, '>', 0, 'native nextval reissues values: the scenario bites');
		next;
	}
	is($reissued, 0, "$label: no value handed out again after the failover");
	is($twice_before, 0, "$label: no value handed out twice before it");
	cmp_ok($max_post, '>', $max_pre, "$label: the promoted standby drew past the old primary's values");
}

$mc->kill;
done_testing();

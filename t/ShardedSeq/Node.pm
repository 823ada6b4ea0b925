# t/ShardedSeq/Node.pm: what the TAP tests share about servers.  A node set
# up for sharded_seq (PostgreSQL::Test::Cluster, optionally preloaded, with a
# database holding the extension), wait points (src/common/wait_point.c) held
# and let go from a session of the test's, sessions run at once (waited for,
# or left running as a load), and the checks several tests make of the
# values and totals they collected.
package ShardedSeq::Node;

use strict;
use warnings;

use Exporter 'import';
use File::Basename qw(dirname);
use IPC::Run;
use ShardedSeq::Versions;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Fcntl qw(:flock);
use Time::HiRes qw(usleep gettimeofday);

our @EXPORT = (
	# nodes and databases
	qw(ssq_node ssq_db install_versions sync_standby),
	# wait points, and waiting on other things
	qw(wait_point_hold wait_point_release wait_point_reached wait_point_sql
	  worker_settled worker_round poll_until),
	# sessions: at once and waited for (parallel_psql, draw_sessions), one
	# kept open (bg_query), or a load left running (load_*, stop_point)
	qw(parallel_psql draw_sessions bg_query
	  load_start load_progress load_running load_finish load_cut_off
	  stop_point stop_load),
	# checks of what was collected
	qw(values_check check_drawn ledger_check));

# A test stopped by a signal (the runner's timeout, an interrupt) still runs
# its END blocks, which stop its servers: PostgreSQL 15's framework sets no
# handler, and the servers, which pg_ctl detaches, would outlive the test.
# A second signal (timeout passes one on to its whole group) must not end the
# END blocks in turn.
$SIG{TERM} = $SIG{INT} = sub {
	$SIG{TERM} = $SIG{INT} = 'IGNORE';
	die "stopped by SIG$_[0]\n";
};

# Every node that PostgreSQL::Test::Cluster's init would initdb is a copy of
# a cluster initdb made once with the same options, as PostgreSQL 17's own
# framework does with INITDB_TEMPLATE (which 15 and 16 lack): once per run
# when the runner names a directory for it (SSQ_INITDB_TEMPLATE, set by
# scripts/test.sh), else once per test file.  Unlike INITDB_TEMPLATE, each
# copy gets a system identifier of its own, as initdb would give it (node
# claims, cutover stops and memcached keys are per system), and pg_resetwal
# writes its WAL anew under it.
delete $ENV{INITDB_TEMPLATE};
{
	no warnings 'redefine';
	my $system_or_bail = \&PostgreSQL::Test::Utils::system_or_bail;
	*PostgreSQL::Test::Utils::system_or_bail = sub {
		return $system_or_bail->(@_) unless $_[0] eq 'initdb';
		# the data directory (-D DIR up to 17, --pgdata DIR from 18) and
		# the other options, which the template is made with
		my ($pgdata, @args);
		for (my $i = 1; $i <= $#_; $i++)
		{
			if ($_[$i] eq '-D' || $_[$i] eq '--pgdata') { $pgdata = $_[ ++$i ]; }
			else { push @args, $_[$i]; }
		}
		return $system_or_bail->(@_) unless defined $pgdata;
		return initdb_copy($system_or_bail, $pgdata, @args);
	};
}

sub initdb_copy
{
	my ($system_or_bail, $pgdata, @args) = @_;
	my $base = $ENV{SSQ_INITDB_TEMPLATE}
	  // "$PostgreSQL::Test::Utils::tmp_check/initdb-template";
	(my $key = join('', @args) || 'default') =~ s/[^A-Za-z0-9]+/_/g;
	my $template = "$base/$key";
	mkdir $base;
	open my $lock, '>', "$template.lock" or die "$template.lock: $!";
	flock($lock, LOCK_EX) or die "flock $template.lock: $!";
	unless (-d $template)
	{
		PostgreSQL::Test::Utils::system_log('rm', '-rf', "$template.partial");
		$system_or_bail->('initdb', '-D', "$template.partial", @args);
		rename("$template.partial", $template) or die "rename $template: $!";
	}
	close $lock;
	$system_or_bail->('cp', '-RPp', $template, $pgdata);
	new_system_identifier($pgdata);
	$system_or_bail->('pg_resetwal', '-D', $pgdata);
	return;
}

# new_system_identifier(PGDATA): a fresh system identifier (made as initdb
# makes one) in the first field of global/pg_control, and the file's CRC-32C
# again; the CRC is found where it follows the bytes it covers, as the
# layout differs by major.
my $sysid_seq = 0;
sub new_system_identifier
{
	my ($pgdata) = @_;
	my $file = "$pgdata/global/pg_control";
	open my $fh, '+<:raw', $file or die "$file: $!";
	my $buf = do { local $/; <$fh> };
	my ($crc, $at) = (0xFFFFFFFF, undef);
	for my $i (0 .. 1023)
	{
		if ($i >= 8 && $i % 4 == 0
			&& ($crc ^ 0xFFFFFFFF) == unpack('V', substr($buf, $i, 4)))
		{
			$at = $i;
			last;
		}
		$crc = crc32c_byte($crc, ord(substr($buf, $i, 1)));
	}
	die "no CRC found in $file" unless defined $at;
	my ($sec, $usec) = gettimeofday();
	my $sysid = ($sec << 32) | ($usec << 12) | (($$ + $sysid_seq++) & 0xFFF);
	substr($buf, 0, 8) = pack('Q<', $sysid);
	$crc = 0xFFFFFFFF;
	$crc = crc32c_byte($crc, ord(substr($buf, $_, 1))) for 0 .. $at - 1;
	substr($buf, $at, 4) = pack('V', $crc ^ 0xFFFFFFFF);
	seek($fh, 0, 0) or die "seek $file: $!";
	print $fh $buf or die "write $file: $!";
	close $fh or die "close $file: $!";
	return;
}

# CRC-32C (Castagnoli, reflected), a byte at a time
my @crc32c_table = map {
	my $c = $_;
	$c = ($c & 1) ? (($c >> 1) ^ 0x82F63B78) : ($c >> 1) for 1 .. 8;
	$c
} 0 .. 255;
sub crc32c_byte
{
	my ($crc, $byte) = @_;
	return $crc32c_table[ ($crc ^ $byte) & 0xFF ] ^ ($crc >> 8);
}

# the advisory lock classes of wait points: every backend at a point, and
# one backend at a point (WAIT_POINT_CLASS, WAIT_BACKEND_CLASS)
use constant WAIT_POINT_CLASS => 1397970768;
use constant WAIT_BACKEND_CLASS => 1397965378;

# ssq_node(NAME, preload => 0|1, conf => TEXT, db => NAME, start => 0|1,
#          allows_streaming => 0|1|'logical'): a new node with the settings
# the tests rely on, started, with database db (default 'stress') holding the
# extension.
sub ssq_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(allows_streaming => $opts{allows_streaming} // 0);
	# A long WAL writer delay keeps unflushed WAL in memory for longer, so
	# a crash test would catch a reservation handed out before its WAL was
	# flushed.
	$node->append_conf(
		'postgresql.conf', q{
max_connections = 100
max_prepared_transactions = 10
shared_buffers = 256MB
wal_writer_delay = 10s
});
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'sharded_seq'\n")
	  if $opts{preload};
	$node->append_conf('postgresql.conf', $opts{conf}) if $opts{conf};
	return $node if defined $opts{start} && !$opts{start};
	$node->start;
	ssq_db($node, $opts{db} // 'stress');
	return $node;
}

# ssq_db(NODE, DB, EXTENSIONS...): create DB with the extension (and others)
sub ssq_db
{
	my ($node, $db, @more) = @_;
	$node->safe_psql('postgres', qq{CREATE DATABASE "$db"});
	$node->safe_psql($db, "CREATE EXTENSION $_")
	  for ('sharded_seq', @more);
	return;
}

# The SQL arguments of the lock of wait point NAME: for every backend, or
# with PID for that backend only.
sub wait_point_sql
{
	my ($name, $pid) = @_;
	return defined $pid
	  ? WAIT_BACKEND_CLASS . ", pg_catalog.hashtext('$name') OPERATOR(pg_catalog.#) $pid"
	  : WAIT_POINT_CLASS . ", pg_catalog.hashtext('$name')";
}

# wait_point_hold(NODE, DB, NAME [, PID]): a session that holds wait point
# NAME in DB; every backend of DB that reaches it (or backend PID only)
# waits there until wait_point_release.
sub wait_point_hold
{
	my ($node, $db, $name, $pid) = @_;
	my $h = $node->background_psql($db);
	$h->query_safe(
		'SELECT pg_catalog.pg_advisory_lock(' . wait_point_sql($name, $pid) . ')');
	$h->{wait_point} = [ $name, $pid ];
	return $h;
}

sub wait_point_release
{
	my ($holder) = @_;
	$holder->query_safe('SELECT pg_catalog.pg_advisory_unlock('
		  . wait_point_sql(@{ $holder->{wait_point} }) . ')');
	$holder->quit;
	return;
}

# wait_point_reached(NODE, DB, NAME): the pid of a backend waiting at wait
# point NAME of DB, once one does (polled, bounded by the test timeout).
sub wait_point_reached
{
	my ($node, $db, $name) = @_;
	my $q = "SELECT l.pid FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_database d ON d.oid = l.database
	          WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = '$db' AND l.objsubid = 2
	            AND ((l.classid = " . WAIT_POINT_CLASS . "::oid AND l.objid = pg_catalog.hashtext('$name')::oid)
	              OR (l.classid = " . WAIT_BACKEND_CLASS . "::oid
	                  AND l.objid = (pg_catalog.hashtext('$name') # l.pid)::oid))
	          LIMIT 1";
	$node->poll_query_until($db, "SELECT EXISTS ($q)")
	  or die "no backend reached wait point $name";
	return $node->safe_psql($db, $q);
}

# parallel_psql(NODE, DB, SQL...): one psql session per SQL, all at once
# (ON_ERROR_STOP, unaligned tuples only); their outputs, in order, once all
# have ended.  Dies, with their errors, if one failed.  The simple case of
# load_start ... load_finish, for sessions the test only waits for.  A SQL
# string is one psql -c: one query string, hence one transaction however
# many statements it holds.  A SQL that is an array reference is a session
# running each of its strings in turn (one -c each), so that a BEGIN ...
# ROLLBACK among them leaves the others committed.
sub parallel_psql
{
	my ($node, $db, @sqls) = @_;
	my (@runs, @out, @err);
	for my $i (0 .. $#sqls)
	{
		($out[$i], $err[$i]) = ('', '');
		push @runs,
		  IPC::Run::start(
			[
				$node->installed_command('psql'), '-XAtq', '-v',
				'ON_ERROR_STOP=1', '-d', $node->connstr($db),
				map { ('-c', $_) } ref $sqls[$i] ? @{ $sqls[$i] } : $sqls[$i]
			],
			'>', \$out[$i], '2>', \$err[$i]);
	}
	my @failed;
	for my $i (0 .. $#runs)
	{
		push @failed, "session $i: $err[$i]" unless $runs[$i]->finish;
	}
	die join("\n", @failed) if @failed;
	return @out;
}

# draw_sessions(NODE, DB, PHASE, COUNT, SEQ...): COUNT sessions at once draw
# from each sharded sequence SEQ, 300 values in committed statements and 50 in
# a rolled-back transaction; every value goes into table drawn (seq text,
# v bigint, phase text) of DB, with PHASE, for check_drawn.
sub draw_sessions
{
	my ($node, $db, $phase, $count, @seqs) = @_;
	my $sql = [
		map {
			(   "SELECT '$_', sharded_nextval('$_') FROM generate_series(1, 300)",
				'BEGIN',
				"SELECT '$_', sharded_nextval('$_') FROM generate_series(1, 50)",
				'ROLLBACK')
		} @seqs
	];
	my @out = parallel_psql($node, $db, ($sql) x $count);
	my $rows = join '', map { s/\|/\t/gr . "\t$phase\n" } grep { /\S/ } map { split /\n/ } @out;
	$node->safe_psql($db, "COPY drawn FROM STDIN;\n$rows\\.\n");
	return;
}

# check_drawn(NODE, DB): the check of table drawn in t/ShardedSeq/check_drawn.sql
# (one line: each sequence's figures, then OK or BAD for all of them)
sub check_drawn
{
	my ($node, $db) = @_;
	return $node->safe_psql($db,
		slurp_file(dirname(__FILE__) . '/check_drawn.sql'));
}

# worker_settled(NODE, DB): wait until the background worker has done its
# first round in DB, so that a test driving flushes by hand is not raced by it.
sub worker_settled
{
	my ($node, $db) = @_;
	$node->poll_query_until($db,
		"SELECT count(*) = 1 FROM sharded_seq.workers WHERE database = '$db' AND last_flush_at IS NOT NULL"
	) or die "the background worker did not start in $db";
	return;
}

# worker_round(NODE, DB): wait until DB's worker has done a whole round (a
# flush of every counter, after reading its settings) that began after this
# call: a round ends after the call, and another one after that.
# sync_standby(PRIMARY): a streaming standby from a fresh base backup of
# PRIMARY (made with allows_streaming), started, then made its synchronous
# standby ('*'; set after the backup, so a promoted standby waits for
# nobody).  Returns the standby once pg_stat_replication says 'sync'.
sub sync_standby
{
	my ($primary) = @_;
	$primary->backup('base');
	my $standby = PostgreSQL::Test::Cluster->new('standby');
	$standby->init_from_backup($primary, 'base', has_streaming => 1);
	$standby->start;
	$primary->safe_psql('postgres',
		"ALTER SYSTEM SET synchronous_standby_names = '*'; SELECT pg_reload_conf()");
	$primary->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_replication WHERE sync_state = 'sync'")
	  or die 'the standby did not become synchronous';
	return $standby;
}

sub worker_round
{
	my ($node, $db) = @_;
	for (1 .. 2)
	{
		my $last = $node->safe_psql($db,
			"SELECT coalesce(last_flush_at, '-infinity') FROM sharded_seq.workers WHERE database = '$db'");
		$node->poll_query_until($db,
			"SELECT last_flush_at > '$last' FROM sharded_seq.workers WHERE database = '$db'")
		  or die "the worker of $db did no round";
	}
	return;
}

# poll_until(CODE, WHAT): call CODE every 100 ms until it returns true
# (bounded by the test timeout, then dies saying it waited for WHAT): for
# conditions outside one query, such as a memcached statistic
sub poll_until
{
	my ($code, $what) = @_;
	for (1 .. 10 * $PostgreSQL::Test::Utils::timeout_default)
	{
		return 1 if $code->();
		usleep(100_000);
	}
	die "timed out waiting for $what";
}

# load_start(NODE, DB, NAME, SCRIPTS...): one psql per SQL script (written to
# NAME.I.sql in the test's directory, run with -f, ON_ERROR_STOP off,
# unaligned tuples, output to NAME.I.out and NAME.I.err: files, so that
# nobody needs to read them while it runs; messages carry psql's
# "psql:FILE:LINE: " prefix), all started at once and left running while
# the test does other things: until a crash or a stop cuts them off, until
# their scripts end, or until stop_load (see stop_point).  Returns the load,
# for load_progress, load_running, load_finish and load_cut_off.  For
# sessions the test just waits for, parallel_psql is simpler.
sub load_start
{
	my ($node, $db, $name, @scripts) = @_;
	my @load;
	for my $i (0 .. $#scripts)
	{
		my $file = "$PostgreSQL::Test::Utils::tmp_check/$name.$i";
		PostgreSQL::Test::Utils::append_to_file("$file.sql", $scripts[$i]);
		my %s = (file => $file);
		$s{run} = IPC::Run::start(
			[
				$node->installed_command('psql'), '-XAtq', '-v',
				'ON_ERROR_STOP=0', '-d', $node->connstr($db), '-f', "$file.sql"
			],
			'>', "$file.out", '2>', "$file.err");
		push @load, \%s;
	}
	return \@load;
}

# load_progress(LOAD, LINES): wait until every session of LOAD has printed
# LINES lines (each is busy, and far enough in).
sub load_progress
{
	my ($load, $lines) = @_;
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	for my $s (@$load)
	{
		while (1)
		{
			my $n = 0;
			if (open my $fh, '<', "$s->{file}.out")
			{
				$n++ while <$fh>;
				close $fh;
			}
			last if $n >= $lines;
			die "the load did not print $lines lines in time" if time > $deadline;
			usleep(20_000);
		}
	}
	return;
}

# load_running(LOAD): how many sessions of LOAD still run
sub load_running
{
	my ($load) = @_;
	return scalar grep { $_->{run}->pumpable } @$load;
}

# load_finish(LOAD): wait until every session of LOAD has ended; then each
# one's {out} and {err} hold what it printed on stdout and stderr.  Returns
# the same as two array references, outputs and errors, session by session.
sub load_finish
{
	my ($load) = @_;
	for my $s (@$load)
	{
		$s->{run}->finish;
		$s->{out} = PostgreSQL::Test::Utils::slurp_file("$s->{file}.out");
		$s->{err} = PostgreSQL::Test::Utils::slurp_file("$s->{file}.err");
	}
	return ([ map { $_->{out} } @$load ], [ map { $_->{err} } @$load ]);
}

# load_cut_off(LOAD): load_finish, then how many of its sessions lost their
# connection (a crash or a stop cut them off before their script ended).
sub load_cut_off
{
	my ($load) = @_;
	load_finish($load);
	return scalar grep { $_->{err} =~ /connection|terminat/i } @$load;
}

# A load (load_start) that runs until the test has done what it runs for,
# however long that takes: stop_point(TAG) is psql text that a load's script
# puts between its transactions, where the session ends once
# stop_load(NODE, DB, TAG) has run (it creates table load_stop_TAG in DB,
# which the point looks for).
sub stop_point
{
	my ($tag) = @_;
	return "SELECT EXISTS (SELECT FROM pg_catalog.pg_class WHERE relname = 'load_stop_$tag') AS stop \\gset\n"
	  . "\\if :stop\n\\q\n\\endif\n";
}

sub stop_load
{
	my ($node, $db, $tag) = @_;
	$node->safe_psql($db, "CREATE TABLE load_stop_$tag ()");
	return;
}

# values_check(WHAT, SESSIONS...): the values each session received, in
# order: a session's output (values one a line, other lines skipped) or a
# reference to a list of values.  One test: passes if some value came, no
# value repeats across all sessions (S1) and each session's strictly
# increase (S2); notes the counts as a RESULT, and the first offenders as
# diagnostics.  Returns how many values there were.
sub values_check
{
	my ($what, @sessions) = @_;
	my (%seen, @dups, @order);
	my $total = 0;
	for my $s (@sessions)
	{
		my $prev;
		for my $v (ref $s ? @$s : $s =~ /^(-?\d+)$/mg)
		{
			$total++;
			push @dups, $v if $seen{$v}++ == 1;
			push @order, "$v after $prev" if defined $prev && $v <= $prev;
			$prev = $v;
		}
	}
	note("RESULT $what: values=$total sessions=" . scalar(@sessions)
		  . ' duplicates=' . scalar(@dups) . ' out_of_order=' . scalar(@order));
	diag("handed out twice: @dups[0 .. ($#dups < 4 ? $#dups : 4)]") if @dups;
	diag("out of order: @order[0 .. ($#order < 4 ? $#order : 4)]") if @order;
	ok($total > 0 && !@dups && !@order,
		"$what: $total values, none handed out twice, each session's increasing");
	return $total;
}

# ledger_check(NODE, DB, WHAT): each counter's total against the sum of
# table ledger (counter text, delta bigint), which every committed increment
# of the test also wrote in its transaction; one test and one RESULT each.
sub ledger_check
{
	my ($node, $db, $what) = @_;
	my $rows = $node->safe_psql(
		$db, q{
SELECT c.name, counter_value(c.name), (SELECT coalesce(sum(delta), 0) FROM ledger l WHERE l.counter = c.name),
       (SELECT count(*) FROM ledger l WHERE l.counter = c.name)
  FROM sharded_seq.counters c ORDER BY 1});
	my @lines = split /\n/, $rows;
	# with no counter there is nothing to compare: that is a failure
	ok(scalar @lines, "$what: there are counters to check");
	for my $line (@lines)
	{
		my ($name, $total, $ledger, $n) = split /\|/, $line;
		note("RESULT $what: counter $name total=$total ledger=$ledger committed increments=$n");
		is($total, $ledger, "$what: counter $name equals its ledger");
	}
	return $rows;
}

# install_versions(NODE): what NODE's installed install scripts provide
# (ShardedSeq::Versions).
sub install_versions
{
	my ($node) = @_;
	return ShardedSeq::Versions::install_versions_in(
		$node->config_data('--sharedir') . '/extension');
}

# bg_query(SESSION, SQL): run SQL in a BackgroundPsql session; its output,
# and in list context also what it printed on stderr for this SQL alone
# (BackgroundPsql on 15 keeps stderr across queries: cleared here first).
sub bg_query
{
	my ($h, $sql) = @_;
	$h->{stderr} = '';
	my $out = $h->query($sql);
	my $err = $h->{stderr};
	$h->{stderr} = '';
	return wantarray ? ($out, $err) : $out;
}

1;

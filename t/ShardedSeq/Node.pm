# t/ShardedSeq/Node.pm: what the TAP tests share about servers.  A node set
# up for sharded_seq (PostgreSQL::Test::Cluster, optionally preloaded, with a
# database holding the extension), wait points (src/common/wait_point.c) held
# and let go from a session of the test's, and the checks several tests make
# of the values and totals they collected.
package ShardedSeq::Node;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

our @EXPORT = qw(ssq_node ssq_db wait_point_hold wait_point_release
  wait_point_reached wait_point_sql worker_settled parallel_psql);

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
# have ended.  Dies, with their errors, if one failed.
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
				'ON_ERROR_STOP=1', '-d', $node->connstr($db), '-c', $sqls[$i]
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

# bg_query(SESSION, SQL): run SQL in a BackgroundPsql session; its output,
# and in list context also what it printed on stderr for this SQL alone
# (BackgroundPsql on 15 keeps stderr across queries: cleared here first).
push @EXPORT, 'bg_query';
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

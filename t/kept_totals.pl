# C4 where rows change without this extension's marks (preloaded): a kept
# total must not outlive
#   1. COMMIT PREPARED of a transaction prepared before a restart (the
#      layout words start again at zero);
#   2. WAL replay on a hot standby;
#   3. a commit newer than the snapshot it was read with (REPEATABLE READ);
#   4. a commit, when shared between sessions (sharded_seq.shared_totals),
#      nor be taken by a snapshot older than it; new sessions reading while
#      commits go on never see a total outside the ledger;
#   5. a database dropped and created again with the same OID;
# and 6. after PREPARE TRANSACTION and COMMIT PREPARED the total is kept
# again.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

my $node = ssq_node('primary', preload => 1, allows_streaming => 1);
my $db = 'stress';
sub sql { return $node->safe_psql($db, $_[0]); }
# a session that reads with psql's tuples-only output: the last line it printed
sub session
{
	my ($n, $d) = @_;
	my $h = ($n // $node)->background_psql($d // $db, on_error_stop => 0);
	$h->set_query_timer_restart;
	return $h;
}
sub last_value { my @l = split /\n/, $_[0]->query_safe($_[1]); return $l[-1]; }
# reads COUNT times in one statement each: the first reads the rows, a later
# one keeps (and shares) the total
sub reads { my ($name, $count) = @_; return "SELECT counter_value('$name');\n" x $count; }

# 1. COMMIT PREPARED of a transaction from before a restart
sql("SELECT sharded_seq.create_counter('c', shards => 4)");
sql("SELECT counter_incr('c', 1)");
sql("BEGIN; SELECT counter_incr('c', 100); PREPARE TRANSACTION 'p1';");
$node->restart;
my $r = session();
is(last_value($r, reads('c', 4)), '1', 'before COMMIT PREPARED, R reads 1');
sql("COMMIT PREPARED 'p1'");
sql('SELECT txid_current()');
is(last_value($r, reads('c', 1)), '101',
	'after COMMIT PREPARED of a transaction prepared before a restart, R reads 101');
$r->quit;

# 2. a hot standby: replay changes the rows under a session that kept them
$node->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($node, 'b', has_streaming => 1);
$standby->start;
$node->wait_for_catchup($standby, 'replay');
my $s = session($standby);
is(last_value($s, reads('c', 4)), '101', 'the standby session reads 101');
for my $want (201, 301)
{
	sql("SELECT counter_incr('c', 100)");
	$node->wait_for_catchup($standby, 'replay');
	is(last_value($s, reads('c', 1)), $want,
		"after an increment on the primary, the standby session reads $want");
}
$s->quit;
$standby->stop;

# 3. a snapshot older than a commit
sql("SELECT counter_incr('r', 5)");
for my $name ('r', 'c')
{
	my $before = sql("SELECT counter_value('$name')");
	my $o = session();
	# the snapshot is taken by SELECT 1, before the other session's commit
	$o->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;');
	sql("SELECT counter_incr('$name', 1000)");
	is(last_value($o, reads($name, 3)), $before, "$name: the old snapshot reads $before");
	is( last_value($o, "COMMIT;\n" . reads($name, 2)),
		$before + 1000,
		"$name: after the transaction whose snapshot predates a commit, the session reads "
		  . ($before + 1000));
	$o->quit;
}

# 4. totals shared between sessions
sql("SELECT counter_incr('s', 7)");
sql(reads('s', 2));    # a session keeps the total and shares it
sql(reads('s', 2));
sql("SELECT counter_incr('s', 1000)");
is(sql("SELECT counter_value('s')"), '1007',
	'a new session after a commit reads 1007, not the shared total the commit made old');
my $o = session();
$o->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;');
sql("SELECT counter_incr('s', 1000)");
sql(reads('s', 2));    # another session keeps the newer total
is(last_value($o, reads('s', 1)), '1007',
	'a snapshot older than the shared total reads 1007, not the shared total');
$o->query_safe('COMMIT');
$o->quit;

# new sessions, each meeting a counter for the first time, read while
# commits go on: never a total outside the ledger around the read
sql(q{
CREATE TABLE ledger (c int, d bigint);
CREATE TABLE seen_wrong (c int, lo bigint, v bigint, hi bigint);
SELECT counter_incr('k' || g, 0) FROM generate_series(1, 20) g;
});
my $dir = $PostgreSQL::Test::Utils::tmp_check;
PostgreSQL::Test::Utils::append_to_file("$dir/write.sql", q{
\set i random(1, 20)
\set d random(1, 9)
BEGIN;
SELECT counter_incr('k' || :i, :d);
INSERT INTO ledger VALUES (:i, :d);
COMMIT;
});
# read committed: each statement's snapshot is newer than the one before
PostgreSQL::Test::Utils::append_to_file("$dir/read.sql", q{
\set i random(1, 20)
SELECT coalesce(sum(d), 0) AS lo FROM ledger WHERE c = :i \gset
SELECT counter_value('k' || :i) AS v \gset
SELECT coalesce(sum(d), 0) AS hi FROM ledger WHERE c = :i \gset
INSERT INTO seen_wrong SELECT :i, :lo, :v, :hi WHERE :v < :lo OR :v > :hi;
});
# the writers run until the readers are done
my ($wout, $werr) = ('', '');
my $writers = IPC::Run::start(
	[ $node->installed_command('pgbench'), '-n', '-c', '4', '-j', '2', '-T', '600', '-f', "$dir/write.sql", $node->connstr($db) ],
	'>', \$wout, '2>', \$werr);
$node->poll_query_until($db, 'SELECT count(*) > 100 FROM ledger') or die 'no writes';
# -C: a new session for every read
my ($rout, $rerr) = ('', '');
IPC::Run::run(
	[ $node->installed_command('pgbench'), '-n', '-C', '-c', '4', '-j', '2', '-t', '60', '-f', "$dir/read.sql", $node->connstr($db) ],
	'>', \$rout, '2>', \$rerr) or die "readers: $rerr";
my $written = sql('SELECT count(*) FROM ledger');
$node->poll_query_until($db, "SELECT count(*) > $written FROM ledger") or die 'writers stopped';
$writers->signal('INT');
$writers->finish;
my ($reads) = $rout =~ /^number of transactions actually processed: (\d+)/m;
my $wrong = sql('SELECT count(*) FROM seen_wrong');
my $differ = sql(q{SELECT count(*) FROM generate_series(1, 20) g
             WHERE counter_value('k' || g) <> (SELECT coalesce(sum(d), 0) FROM ledger WHERE c = g)});
note("RESULT $reads reads from new sessions during $written commits: $wrong outside the ledger; $differ counters differ from it after");
is($reads, 240, 'every read from a new session ran');
is($wrong, '0', 'no new session read a total outside the ledger')
  or diag(sql('SELECT * FROM seen_wrong LIMIT 3'));
is($differ, '0', 'every counter equals the ledger after');

# 5. a database created again with the same OID
$node->safe_psql('postgres', 'CREATE DATABASE tmpl');
$node->safe_psql('tmpl', q{
CREATE EXTENSION sharded_seq;
SELECT sharded_seq.create_counter('c', shards => 4);
SELECT counter_incr('c', 5);
});
$node->safe_psql('postgres', 'CREATE DATABASE again TEMPLATE tmpl OID 70000');
$node->safe_psql('again', "SELECT counter_incr('c', 1000)");
# the first database "again" keeps and shares its total
$node->safe_psql('again', reads('c', 3));
$node->safe_psql('postgres', 'DROP DATABASE again');
$node->safe_psql('postgres', 'CREATE DATABASE again TEMPLATE tmpl OID 70000');
is($node->safe_psql('again', "SELECT counter_value('c')"), '5',
	"the new database with the dropped one's OID reads 5, not the dropped one's shared total");

# 6. PREPARE TRANSACTION leaves the word settled: kept again after
sql("SELECT counter_incr('p', 1)");
sql("BEGIN; SELECT counter_incr('p', 10); PREPARE TRANSACTION 'p2';");
sql("COMMIT PREPARED 'p2'");
$r = session();
is(last_value($r, reads('p', 2)), '11', 'R reads 11 after COMMIT PREPARED');
# a kept total reads no row: it needs no lock on counter_shards.  A 1 ms
# lock timeout fails any read that has to wait for the lock at all.
my $l = session();
$l->query_safe('BEGIN; LOCK TABLE sharded_seq.counter_shards IN ACCESS EXCLUSIVE MODE;');
my ($got, $failed) = $r->query("SET lock_timeout = '1ms'; SELECT 'locked ' || counter_value('p');");
$l->query_safe('ROLLBACK');
$l->quit;
is($got, 'locked 11',
	'after PREPARE and COMMIT PREPARED, with counter_shards locked, R reads 11 from its kept total');
$r->quit;

done_testing();

# C4's safety net (preloaded): a total is kept only while every write of the
# shard rows marks its layout word, and anything that can hide a write from
# those marks drops every kept and shared total.  In each case session K keeps
# a counter's total first (checked: K reads it while counter_shards is locked
# ACCESS EXCLUSIVE, so it read no row), rows change behind the engine, and K,
# a session T in an open READ COMMITTED transaction, a new session and a new
# REPEATABLE READ session must all see the change:
#   1. schema 1.2 (no trigger), by hand, before and after ALTER EXTENSION UPDATE;
#   2. DISABLE TRIGGER ALL, UPDATE (or a restore's COPY), ENABLE TRIGGER ALL in
#      one transaction; ENABLE TRIGGER ALL leaves the triggers firing ALWAYS;
#   3. DISABLE TRIGGER committed on its own, and keeping again once it is back;
#   4. VACUUM FULL and CLUSTER;
#   5. the owner's UPDATE in a security-restricted operation (REFRESH
#      MATERIALIZED VIEW), and one as a replica (session_replication_role);
#   6. TRUNCATE and the rows written again;
#   7. ANALYZE, VACUUM, DDL in another database and a session idle in a
#      transaction with an xid leave totals kept;
#   8. another role's ALTER TABLE of its own table is not touched.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

my $node = ssq_node('main', preload => 1);
my $db = 'stress';
sub sql { return $node->safe_psql($db, $_[0]); }
sub session
{
	my ($d) = @_;
	my $h = $node->background_psql($d // $db, on_error_stop => 0);
	$h->set_query_timer_restart;
	return $h;
}
sub last_value { my @l = split /\n/, $_[0]->query_safe($_[1]); return $l[-1] // ''; }
sub shard1
{
	return "counter_id OPERATOR(pg_catalog.=) (SELECT id FROM sharded_seq.counter_config WHERE name = '$_[0]') AND shard = 1";
}
my ($k, $t);
my $t_open = 0;    # T is in a transaction

# is_kept(NAME, WANT): K reads NAME while counter_shards is locked ACCESS
# EXCLUSIVE: only a kept total can answer, and it must be WANT.  A 1 ms lock
# timeout fails any read that has to wait for the lock at all.
sub is_kept
{
	my ($name, $want) = @_;
	my $l = session($db);
	$l->query_safe('BEGIN; LOCK TABLE sharded_seq.counter_shards IN ACCESS EXCLUSIVE MODE;');
	my ($got) = $k->query("SET lock_timeout = '1ms'; SELECT 'kept ' || counter_value('$name'); RESET lock_timeout;");
	$k->{stderr} = '';    # BackgroundPsql keeps it, for the next query_safe
	$l->query_safe('ROLLBACK');
	$l->quit;
	is($got, "kept $want", "K keeps $name at $want");
	return;
}
# keep(NAME, WANT): a new session K reads NAME until it keeps it (the second
# read keeps at the latest), and T, in an open READ COMMITTED transaction,
# reads it too.
sub keep
{
	my ($name, $want) = @_;
	$k->quit if $k;
	$k = session($db);
	my $r = "SELECT counter_value('$name');";
	is(last_value($k, "$r $r $r"), $want, "a new session reads $want of $name");
	is_kept($name, $want);
	is(last_value($t, "BEGIN; $r $r"), $want, "T reads $want of $name");
	$t_open = 1;
	return;
}
# all_read(NAME, WANT, WHAT): K, T (its next statement, in the same
# transaction, which then commits), a new session, and a new REPEATABLE READ
# session read WANT.
sub all_read
{
	my ($name, $want, $what) = @_;
	my $r = "SELECT counter_value('$name')";
	my $got = join ' ',
	  last_value($k, $r),
	  last_value($t, $t_open ? "$r; COMMIT;" : "$r;"),
	  $node->safe_psql($db, $r),
	  $node->safe_psql($db, "BEGIN ISOLATION LEVEL REPEATABLE READ; $r; COMMIT;");
	is($got, join(' ', ($want) x 4),
		"$what: K, " . ($t_open ? 'an open transaction' : 'T')
		  . ", a new session and a new REPEATABLE READ one read $want");
	$t_open = 0;
	return;
}

# 1. schema 1.2
$node->safe_psql('postgres', 'CREATE DATABASE old12');
$db = 'old12';
sql("CREATE EXTENSION sharded_seq VERSION '1.2'");
sql("SELECT sharded_seq.create_counter('k', 4)");
sql("SELECT counter_incr('k', 10)");
$t = session();
$k = session();
is(last_value($k, "SELECT counter_value('k'); " x 3), '10', 'K reads 10 on schema 1.2');
is(last_value($t, "BEGIN; SELECT counter_value('k'); SELECT counter_value('k');"), '10',
	'T reads 10 on schema 1.2');
$t_open = 1;
sql('UPDATE sharded_seq.counter_shards SET value = value + 1000 WHERE ' . shard1('k'));
all_read('k', 1010, 'schema 1.2, an UPDATE by hand');
sql('ALTER EXTENSION sharded_seq UPDATE');
all_read('k', 1010, 'after ALTER EXTENSION UPDATE');
sql("SELECT counter_incr('k', 5)");
keep('k', 1015);
$t->query_safe('COMMIT');
$t_open = 0;
$k->quit;
$k = undef;
$t->quit;

$db = 'stress';
$t = session();
# one counter per case, so that a case that goes wrong leaves the next alone
sql("SELECT sharded_seq.create_counter('$_', shards => 4)") for qw(c2 c3 c4 c5 c6 c7);
sql("SELECT sharded_seq.create_counter('a2', shards => NULL)");
sql("SELECT counter_incr(name, 10) FROM unnest(ARRAY['c2','c3','c4','c5','c6','c7']) name");
sql("SELECT counter_incr('a2', 7)");
# a write by hand with the trigger in place stops all keeping for the
# server's life (NoteForeignRows): a restart lets the next case keep again
sub restart
{
	$k->quit if $k;
	$k = undef;
	$t->quit;
	$t_open = 0;
	$node->restart;
	$t = session();
	return;
}

# 2. triggers disabled for one transaction
keep('c2', 10);
sql('BEGIN;
ALTER TABLE sharded_seq.counter_shards DISABLE TRIGGER ALL;
UPDATE sharded_seq.counter_shards SET value = value + 1000 WHERE ' . shard1('c2') . ';
ALTER TABLE sharded_seq.counter_shards ENABLE TRIGGER ALL;
COMMIT;');
all_read('c2', 1010, 'DISABLE TRIGGER ALL; UPDATE; ENABLE in one transaction');
keep('a2', 7);
my $id = sql("SELECT id FROM sharded_seq.counter_config WHERE name = 'a2'");
sql("BEGIN;
ALTER TABLE sharded_seq.counter_shards DISABLE TRIGGER ALL;
DELETE FROM sharded_seq.counter_shards WHERE counter_id OPERATOR(pg_catalog.=) $id;
COPY sharded_seq.counter_shards (counter_id, shard, value) FROM stdin;
$id\t0\t300
$id\t1\t400
\\.
ALTER TABLE sharded_seq.counter_shards ENABLE TRIGGER ALL;
COMMIT;");
all_read('a2', 700, "a restore's COPY with triggers disabled");
# ENABLE ALL means 'on origin', which replication's writes skip
is( sql(q{SELECT string_agg(tgname || '=' || tgenabled::text, ' ' ORDER BY tgname) FROM pg_trigger
             WHERE tgrelid = 'sharded_seq.counter_shards'::regclass AND NOT tgisinternal}),
	'rows_changed_elsewhere=A rows_truncated_elsewhere=A',
	'ENABLE TRIGGER ALL leaves both triggers firing ALWAYS');

# 3. a trigger disabled in a transaction of its own
keep('c3', 10);
sql('ALTER TABLE sharded_seq.counter_shards DISABLE TRIGGER rows_changed_elsewhere');
is(last_value($k, "SELECT counter_value('c3'); SELECT counter_value('c3');"), '10',
	'K reads 10 once the trigger is disabled');
sql('UPDATE sharded_seq.counter_shards SET value = value + 1000 WHERE ' . shard1('c3'));
$t->query_safe("SELECT counter_value('c3');");    # in keep's transaction
all_read('c3', 1010, 'an UPDATE while the trigger is disabled');
sql('ALTER TABLE sharded_seq.counter_shards ENABLE ALWAYS TRIGGER rows_changed_elsewhere');
keep('c3', 1010);    # with the trigger back, a session keeps the total again
$t->query_safe('COMMIT');
$t_open = 0;

# 4. VACUUM FULL and CLUSTER
keep('c4', 10);
sql('VACUUM FULL sharded_seq.counter_shards');
sql("SELECT counter_incr('c4', 1)");
all_read('c4', 11, 'VACUUM FULL, then an increment');
keep('c4', 11);
sql('CLUSTER sharded_seq.counter_shards USING counter_shards_pkey');
sql("SELECT counter_incr('c4', 1)");
all_read('c4', 12, 'CLUSTER, then an increment');

# 5. writes the trigger must see
keep('c5', 10);
sql('CREATE FUNCTION bump() RETURNS integer LANGUAGE sql AS
$$ UPDATE sharded_seq.counter_shards SET value = value + 1000 WHERE ' . shard1('c5') . ' RETURNING 1 $$;
CREATE MATERIALIZED VIEW bumped AS SELECT bump() WITH NO DATA;
REFRESH MATERIALIZED VIEW bumped;');
all_read('c5', 1010, "REFRESH MATERIALIZED VIEW running the owner's UPDATE");
restart();
keep('c6', 10);
sql("SET session_replication_role = replica;
UPDATE sharded_seq.counter_shards SET value = value + 1000 WHERE " . shard1('c6'));
all_read('c6', 1010, 'an UPDATE as a replica (session_replication_role), as the apply worker writes');

# 6. TRUNCATE
restart();
keep('c7', 10);
sql('BEGIN;
CREATE TEMP TABLE saved AS SELECT * FROM sharded_seq.counter_shards;
TRUNCATE sharded_seq.counter_shards;
INSERT INTO sharded_seq.counter_shards SELECT * FROM saved;
UPDATE sharded_seq.counter_shards SET value = value + 1000 WHERE ' . shard1('c7') . ';
COMMIT;');
all_read('c7', 1010, 'TRUNCATE and the rows written again');

# 7. what changes no row leaves totals kept
restart();
sql("SELECT sharded_seq.create_counter('c8', shards => 4)");
sql("SELECT counter_incr('c8', 10)");
sql('CREATE TABLE idle_t (a int)');
keep('c8', 10);
$t->query_safe('COMMIT');
$t_open = 0;
# a session idle in a transaction that has an xid, while statistics change
my $i = session();
$i->query_safe('BEGIN; INSERT INTO idle_t VALUES (1);');
sql('ANALYZE sharded_seq.counter_shards');
sql('VACUUM sharded_seq.counter_shards');
$node->safe_psql('postgres', 'CREATE TABLE elsewhere (a int)');
$i->query_safe('SELECT count(*) FROM idle_t;');
is_kept('c8', 10);    # after ANALYZE, VACUUM and DDL elsewhere
$i->query_safe('COMMIT');
$i->quit;
$k->quit;
$t->quit;

# 8. another role's ALTER TABLE of its own table: the trigger left firing on
# origin by a catalog update; nothing of ours may get in alice's way
sql('CREATE ROLE alice LOGIN; GRANT CREATE ON SCHEMA public TO alice');
sql("UPDATE pg_trigger SET tgenabled = 'O' WHERE tgname = 'rows_changed_elsewhere'");
my ($ret, $stdout, $stderr) = $node->psql($db,
	'CREATE TABLE alice_t (a int); ALTER TABLE alice_t ADD COLUMN b int;',
	extra_params => [ '-U', 'alice', '-v', 'ON_ERROR_STOP=1' ]);
is($ret, 0, 'alice alters her own table') or diag($stderr);
is(sql("SELECT tgenabled FROM pg_trigger WHERE tgname = 'rows_changed_elsewhere'"), 'O',
	'the trigger stays on origin until an ALTER TABLE of ours');

done_testing();

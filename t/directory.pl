# The sequence directory (preloaded): a new connection's first
# sharded_nextval takes a node-cached sequence's configuration from shared
# memory instead of reading the tables (src/sequence/directory.c), and never
# a copy older than a change (src/common/config_word.c).  Each part makes a
# change by one path and then checks the next new connection sees it:
#   1. a second connection takes the copy a first one made (DEBUG1 says so);
#   2. revoke_sequence: the next connection of the revoked role is refused;
#   3. the acl changed by hand (UPDATE, the trigger marks it);
#   4. the marking trigger disabled: no copy is made, and a hand UPDATE made
#      while it is off is seen;
#   5. a revoke in a prepared transaction: no copy is trusted while it is
#      prepared, and it is seen once COMMIT PREPARED ran;
#   6. a revoke committed while a connection that read the old row is held
#      at wait point sequence-config-read (before it offers its copy);
#   7. cutover_stop(), a stop row restored by COPY or inserted by hand: the
#      next connection is refused; a configuration row deleted by hand; a
#      base moved by hand with the trigger off, under one session's node
#      reservations; sequence_arrived replaced by a function that marks
#      nothing, config_changed bound to another C symbol, sequence_config
#      inheriting from a table; a change in flight
#      (no copy trusted) and DDL of other objects left open (copies go on);
#      a stop row committed by a two-phase subscription's apply worker;
#   8. drop_sequence; DROP and CREATE EXTENSION with the same name started
#      higher: the next connection draws from the new sequence;
#   9. a transaction that altered the sequence draws from its own change.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShardedSeq::Node;

my $node = ssq_node('main', preload => 1, conf => "max_prepared_transactions = 5\n");
worker_settled($node, 'stress');
sub sql { return $node->safe_psql('stress', $_[0]); }

sql(q{
CREATE ROLE dir_app LOGIN;
SELECT sharded_seq.create_sequence('d', block => 100);
SELECT sharded_seq.grant_sequence('d', 'dir_app');
});

my $from_dir = qr/configuration of sharded sequence "d" taken from the directory/;

# draw(ROLE): a new connection of ROLE draws one value of d; returns
# (value or undef, stderr with the DEBUG1 lines)
sub draw
{
	my ($role) = @_;
	my ($out, $err) = ('', '');
	$node->psql('stress', "SET client_min_messages = debug1; SELECT sharded_nextval('d')",
		stdout => \$out, stderr => \$err, extra_params => [ '-U', $role ]);
	return ($out =~ /^(\d+)$/m ? $1 : undef, $err);
}

# ---- 1. the copy is made and taken ----
my ($v1, $e1) = draw('postgres');
ok(defined $v1, 'a first connection draws');
unlike($e1, $from_dir, '... reading the tables (nothing was copied since create_sequence)');
my ($v2, $e2) = draw('dir_app');
like($e2, $from_dir, 'the next connection takes the configuration from the directory');
cmp_ok($v2, '>', $v1, '... and draws the next value');

# ---- 2. revoke_sequence ----
sql("SELECT sharded_seq.revoke_sequence('d', 'dir_app')");
my ($v3, $e3) = draw('dir_app');
ok(!defined $v3, 'after revoke_sequence, the revoked role is refused');
like($e3, qr/permission denied/, '... with permission denied');

# ---- 3. the acl by hand ----
sql("SELECT sharded_seq.grant_sequence('d', 'dir_app')");
draw('postgres');
my (undef, $e4) = draw('dir_app');
like($e4, $from_dir, 'granted again, the role draws through a new copy');
sql("UPDATE sharded_seq.sequence_config SET acl = NULL WHERE name = 'd'");
my ($v5, $e5) = draw('dir_app');
ok(!defined $v5, 'an acl emptied by hand (UPDATE) is seen by the next connection');
unlike($e5, $from_dir, '... which reads the tables');

# ---- 4. the marking trigger disabled ----
sql("SELECT sharded_seq.grant_sequence('d', 'dir_app')");
sql("ALTER TABLE sharded_seq.sequence_config DISABLE TRIGGER sequence_arrived");
draw('postgres');
my ($v6, $e6) = draw('dir_app');
ok(defined $v6, 'with the trigger disabled, the role still draws');
unlike($e6, $from_dir, '... but no copy is made while the trigger is off');
sql("UPDATE sharded_seq.sequence_config SET acl = NULL WHERE name = 'd'");
my ($v7) = draw('dir_app');
ok(!defined $v7, 'an UPDATE the disabled trigger did not mark is seen');
sql("ALTER TABLE sharded_seq.sequence_config ENABLE ALWAYS TRIGGER sequence_arrived");
sql("SELECT sharded_seq.grant_sequence('d', 'dir_app')");
draw('postgres');
my (undef, $e8) = draw('dir_app');
like($e8, $from_dir, 'the trigger enabled again: copies are made again');

# ---- 5. a prepared transaction ----
sql("BEGIN; SELECT sharded_seq.revoke_sequence('d', 'dir_app'); PREPARE TRANSACTION 'dir_revoke'");
draw('postgres');
my ($v9, $e9) = draw('dir_app');
ok(defined $v9, 'while the revoke is prepared, the role draws');
unlike($e9, $from_dir, '... reading the tables: a prepared change keeps every copy untrusted');
sql("COMMIT PREPARED 'dir_revoke'");
my ($v10) = draw('dir_app');
ok(!defined $v10, 'after COMMIT PREPARED, the revoked role is refused');

# ---- 6. a change committed between a read and its copy ----
sql("SELECT sharded_seq.grant_sequence('d', 'dir_app')");
my $hold = wait_point_hold($node, 'stress', 'sequence-config-read');
# the held connection is the revoked role: its call reads again after the
# revoke's invalidation, and must not find the copy of its first read there
my $reader = load_start($node, 'stress', 'reader', "SET ROLE dir_app;\nSELECT sharded_nextval('d');\n");
wait_point_reached($node, 'stress', 'sequence-config-read');
sql("SELECT sharded_seq.revoke_sequence('d', 'dir_app')");
wait_point_release($hold);
my ($reader_out, $reader_err) = load_finish($reader);
like($reader_err->[0], qr/permission denied/, 'the held connection, let go after the revoke, is refused');
my ($v11, $e11) = draw('dir_app');
ok(!defined $v11, 'a read of the row before a revoke, offered after it, is not trusted');
like($e11, qr/permission denied/, '... the revoked role is refused');
sql("SELECT sharded_seq.grant_sequence('d', 'dir_app')");

# ---- 7. cutover stops ----
draw('postgres');
my $system = sql("SELECT sharded_seq.cutover_stop()");
my ($v12, $e12) = draw('postgres');
ok(!defined $v12, 'after cutover_stop(), the next connection is refused');
like($e12, qr/stopped by a cutover/, '... as stopped by a cutover');
sql("SELECT sharded_seq.cutover_resume()");
draw('postgres');
my (undef, $e13) = draw('postgres');
like($e13, $from_dir, 'resumed: copies again');
sql("COPY sharded_seq.cutover_stops (system_identifier) FROM PROGRAM 'echo $system'");
my ($v14) = draw('postgres');
ok(!defined $v14, 'a stop row restored by COPY is seen by the next connection');
sql("SELECT sharded_seq.cutover_resume()");
draw('postgres');
sql("INSERT INTO sharded_seq.cutover_stops (system_identifier) VALUES ('$system')");
my ($v14b, $e14b) = draw('postgres');
ok(!defined $v14b, 'a stop row inserted by hand is seen by the next connection');
like($e14b, qr/stopped by a cutover/, '... which is refused');
sql("SELECT sharded_seq.cutover_resume()");

# ---- 7b. a row deleted by hand, and an unmarked change under a node reservation ----
sql("SELECT sharded_seq.create_sequence('gone', block => 100)");
sql("SELECT sharded_nextval('gone')");
sql("SELECT sharded_nextval('gone')");
sql("DELETE FROM sharded_seq.sequence_config WHERE name = 'gone'");
my ($gone_out, $gone_err) = ('', '');
$node->psql('stress', "SELECT sharded_nextval('gone')", stdout => \$gone_out, stderr => \$gone_err);
like($gone_err, qr/does not exist/, 'a configuration row deleted by hand is seen by the next connection');
# the trigger off: a change by hand marks nothing; one session reserves
# node blocks before and after it, and must not keep what it read before
sql("SELECT sharded_seq.create_sequence('f', block => 10)");
sql("ALTER TABLE sharded_seq.sequence_config DISABLE TRIGGER sequence_arrived");
my ($f_count, $f_max) = split /\n/, sql(q{
SELECT count(sharded_nextval('f')) FROM generate_series(1, 60);
UPDATE sharded_seq.sequence_config SET base = base + 1000000 WHERE name = 'f';
SELECT max(v) FROM (SELECT sharded_nextval('f') AS v FROM generate_series(1, 60)) x;
});
cmp_ok($f_max, '>=', 1000000,
	'with the trigger off, a base moved by hand is read again by the next node reservation');
sql("ALTER TABLE sharded_seq.sequence_config ENABLE ALWAYS TRIGGER sequence_arrived");

# ---- 7c. a trigger function replaced by one that marks nothing ----
draw('postgres');
my (undef, $e_rep) = draw('dir_app');
like($e_rep, $from_dir, 'before the replacement, the role draws through a copy');
sql(q{CREATE OR REPLACE FUNCTION sharded_seq.sequence_arrived() RETURNS trigger
	LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'});
draw('postgres');
sql("UPDATE sharded_seq.sequence_config SET acl = NULL WHERE name = 'd'");
my ($v_rep) = draw('dir_app');
ok(!defined $v_rep, 'with sequence_arrived replaced, an acl emptied by hand is still seen');
sql(q{CREATE OR REPLACE FUNCTION sharded_seq.sequence_arrived() RETURNS trigger
	LANGUAGE C AS '$libdir/sharded_seq', 'sequence_arrived'});
sql("SELECT sharded_seq.grant_sequence('d', 'dir_app')");

# ---- 7d. a trigger function that is not ours; a change in flight; DDL of others ----
sql(q{CREATE OR REPLACE FUNCTION sharded_seq.config_changed() RETURNS trigger
	LANGUAGE C AS '$libdir/sharded_seq', 'sequence_arrived'});
draw('postgres');
my (undef, $e_sym) = draw('postgres');
unlike($e_sym, $from_dir, 'config_changed bound to another C symbol: no copy is made');
sql(q{CREATE OR REPLACE FUNCTION sharded_seq.config_changed() RETURNS trigger
	LANGUAGE C AS '$libdir/sharded_seq', 'config_changed'});
# a parent's ALTER TABLE could rewrite the rows behind their triggers
sql("CREATE TABLE public.dir_parent (); ALTER TABLE sharded_seq.sequence_config INHERIT public.dir_parent");
draw('postgres');
my (undef, $e_inh) = draw('postgres');
unlike($e_inh, $from_dir, 'sequence_config inheriting from a table: no copy is made');
sql("ALTER TABLE sharded_seq.sequence_config NO INHERIT public.dir_parent");
draw('postgres');
my $open = $node->background_psql('stress');
$open->query_safe("BEGIN");
$open->query_safe("SELECT sharded_seq.grant_sequence('d', 'public')");
my ($v_open, $e_open) = draw('postgres');
ok(defined $v_open, 'while a grant is in flight, a new connection draws');
unlike($e_open, $from_dir, '... reading the tables (no copy is trusted while a change is open)');
$open->query_safe("ROLLBACK");
draw('postgres');
$open->query_safe("BEGIN");
$open->query_safe("CREATE TABLE dir_other (i int); CREATE FUNCTION dir_other_f() RETURNS int LANGUAGE sql AS 'SELECT 1'");
my (undef, $e_other) = draw('postgres');
like($e_other, $from_dir, 'DDL of other objects left open does not stop the copies');
$open->query_safe("COMMIT");
$open->quit;

# ---- 7e. a stop row from a two-phase subscription ----
# the apply worker runs COMMIT PREPARED without the utility hook: the
# prepared transaction keeps the config lock its trigger took
my $pub = ssq_node('pub', preload => 0, allows_streaming => 'logical',
	conf => "max_prepared_transactions = 5\n", db => 'app');
$pub->safe_psql('app', "CREATE PUBLICATION dir_pub FOR TABLE sharded_seq.cutover_stops");
sql("CREATE SUBSCRIPTION dir_sub CONNECTION '" . $pub->connstr . " dbname=app' PUBLICATION dir_pub
	WITH (two_phase = true)");
$node->poll_query_until('stress', "SELECT count(*) = 0 FROM pg_subscription_rel WHERE srsubstate <> 'r'")
  or die 'the subscription did not sync';
$node->poll_query_until('stress', "SELECT subtwophasestate = 'e' FROM pg_subscription WHERE subname = 'dir_sub'")
  or die 'two-phase was not enabled';
my $main_system = sql("SELECT system_identifier FROM pg_control_system()");
draw('postgres');
$pub->safe_psql('app', "BEGIN; INSERT INTO sharded_seq.cutover_stops (system_identifier) VALUES ('$main_system');
	PREPARE TRANSACTION 'dir_stop'");
$node->poll_query_until('stress', "SELECT count(*) = 1 FROM pg_prepared_xacts")
  or die 'the prepared stop did not arrive';
my ($v_prep, $e_prep) = draw('postgres');
ok(defined $v_prep, 'while the stop is prepared here, a new connection draws');
unlike($e_prep, $from_dir, '... reading the tables');
$pub->safe_psql('app', "COMMIT PREPARED 'dir_stop'");
$node->poll_query_until('stress', "SELECT count(*) = 1 FROM sharded_seq.cutover_stops")
  or die 'the stop did not arrive';
my ($v_2pc, $e_2pc) = draw('postgres');
ok(!defined $v_2pc, 'a stop row committed by a two-phase subscription is seen by the next connection');
like($e_2pc, qr/stopped by a cutover/, '... which is refused');
sql("DROP SUBSCRIPTION dir_sub");
sql("SELECT sharded_seq.cutover_resume()");
$pub->stop;

# ---- 8. drops ----
draw('postgres');
sql("SELECT sharded_seq.drop_sequence('d')");
my ($v15, $e15) = draw('postgres');
ok(!defined $v15, 'after drop_sequence, the next connection finds no sequence');
like($e15, qr/does not exist/, '... and says so');
sql("SELECT sharded_seq.create_sequence('d', block => 100)");
draw('postgres');
my ($v16, $e16) = draw('postgres');
like($e16, $from_dir, 'made again, it is copied again');
sql("DROP EXTENSION sharded_seq CASCADE; CREATE EXTENSION sharded_seq");
sql("SELECT sharded_seq.create_sequence('d', block => 100, start => 50000000)");
my ($v17) = draw('postgres');
cmp_ok($v17, '>=', 50000000, 'after DROP and CREATE EXTENSION, the new sequence is drawn');
my ($v18, $e18) = draw('postgres');
cmp_ok($v18, '>', $v17, '... by the next connection too');
like($e18, $from_dir, '... through a copy of the new installation');

# ---- 9. a transaction's own change ----
my $hw = sql("SELECT reserved_high_water FROM sharded_seq.sequences WHERE name = 'd'");
my $own = sql("BEGIN; SELECT sharded_seq.alter_sequence('d', block => 10);
	SELECT sharded_nextval('d'); COMMIT");
cmp_ok($own, '>', $hw, 'a transaction that altered the sequence draws from the new generation');

# ---- 10. inside an open transaction, a draw takes in what others committed ----
# It skips AcceptInvalidationMessages while the config word and the roles
# count have not moved since it last took them in: each change below must
# move one of them, and the next draw of the open transaction must see it.
sql("CREATE ROLE dir_owner; CREATE ROLE dir_member; GRANT dir_owner TO dir_member");
sql("SET ROLE dir_owner; SELECT sharded_seq.create_sequence('d_in')");
my $in = $node->background_psql('stress', on_error_stop => 0);
$in->query_safe("BEGIN; SET LOCAL ROLE dir_member");
bg_query($in, "SELECT sharded_nextval('d_in')") for 1 .. 2;
sql("REVOKE dir_owner FROM dir_member");
my ($v_rev, $e_rev) = bg_query($in, "SELECT sharded_nextval('d_in')");
like($e_rev, qr/permission denied/,
	'inside an open transaction, the draw after a REVOKE of its role is refused');
$in->query_safe("ROLLBACK");
$in->query_safe("BEGIN");
bg_query($in, "SELECT sharded_nextval('d_in')") for 1 .. 2;
sql("SELECT sharded_seq.drop_sequence('d_in')");
my ($v_drop, $e_drop) = bg_query($in, "SELECT sharded_nextval('d_in')");
like($e_drop, qr/does not exist/, '... the draw after a drop committed meanwhile finds none');
$in->query_safe("ROLLBACK");
sql("SELECT sharded_seq.create_sequence('d_in')");
$in->query_safe("BEGIN");
bg_query($in, "SELECT sharded_nextval('d_in')") for 1 .. 2;
sql("DELETE FROM sharded_seq.sequence_shards WHERE seq_id = (SELECT id FROM sharded_seq.sequence_config WHERE name = 'd_in');
	DELETE FROM sharded_seq.sequence_config WHERE name = 'd_in'");
my ($v_hand, $e_hand) = bg_query($in, "SELECT sharded_nextval('d_in')");
like($e_hand, qr/does not exist/, '... and after its rows were deleted by hand');
$in->query_safe("ROLLBACK");
# pg_database_owner is whoever owns the database: ALTER DATABASE OWNER is a role change too
sql("CREATE ROLE dir_dbo; ALTER DATABASE stress OWNER TO dir_dbo");
sql("SELECT sharded_seq.create_sequence('d_dbo'); SELECT sharded_seq.grant_sequence('d_dbo', 'pg_database_owner')");
$in->query_safe("BEGIN; SET LOCAL ROLE dir_dbo");
my ($v_dbo) = bg_query($in, "SELECT sharded_nextval('d_dbo')");
ok(defined $v_dbo && $v_dbo ne '', 'the owner of the database draws through pg_database_owner');
sql("ALTER DATABASE stress OWNER TO CURRENT_USER");
my (undef, $e_dbo) = bg_query($in, "SELECT sharded_nextval('d_dbo')");
like($e_dbo, qr/permission denied/, '... and, inside the same transaction, no longer once another role owns it');
$in->query_safe("ROLLBACK");
$in->quit;

# ---- 11. a role that cannot change the extension's objects does not mark ----
# Its command on them fails its own permission check; marking first would let
# it hold the config lock while it waits for a lock of its own.
sql("CREATE ROLE dir_h; CREATE TABLE public.dir_ht (i int); ALTER TABLE public.dir_ht OWNER TO dir_h");
draw('postgres');
my $holder = $node->background_psql('stress');
$holder->query_safe("BEGIN; LOCK public.dir_ht IN ACCESS SHARE MODE");
my $mover = IPC::Run::start(
	[ $node->installed_command('psql'), '-XAtq', '-d', $node->connstr('stress'),
	  '-c', 'SET ROLE dir_h', '-c', 'ALTER TABLE public.dir_ht SET SCHEMA sharded_seq' ],
	'>', \my $mover_out, '2>', \my $mover_err);
$node->poll_query_until('stress', "SELECT count(*) > 0 FROM pg_stat_activity
	WHERE query LIKE 'ALTER TABLE public.dir_ht%' AND wait_event_type = 'Lock'")
  or die 'the ALTER TABLE did not wait';
is(sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = 0
	AND objid = 1128679255 AND objsubid = 3 AND granted"), '0',
	'an unprivileged role waiting on its own lock holds no config lock');
my ($v_held, $e_held) = draw('postgres');
like($e_held, $from_dir, '... and new connections still take the copy');
$holder->query_safe("ROLLBACK");
$holder->quit;
$mover->finish;
like($mover_err, qr/permission denied/, '... and its command then fails on its own');

done_testing();

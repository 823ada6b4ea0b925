#!/usr/bin/env bash
# The safety net under kept totals (preloaded): a total is kept only while
# every write of the shard rows marks its layout word, and anything that can
# hide a write from those marks drops every kept and shared total.  In each
# case a session K keeps the total of a counter first (checked: K reads it
# while counter_shards is locked ACCESS EXCLUSIVE, so it read no row), then
# rows change behind the engine, and K, a session in an open READ COMMITTED
# transaction, and a new session (shared totals) must all see the change:
#   1. a database still on schema 1.2 (no trigger), by hand, before and
#      after ALTER EXTENSION UPDATE;
#   2. DISABLE TRIGGER ALL, UPDATE, ENABLE TRIGGER ALL in one transaction
#      (what pg_restore --data-only --disable-triggers --single-transaction
#      does), with COPY as a restore writes;
#   3. DISABLE TRIGGER committed on its own, the UPDATE by another session,
#      and keeping again once the trigger is back;
#   4. VACUUM FULL and CLUSTER move every row;
#   5. an UPDATE the extension owner makes inside a security-restricted
#      operation (REFRESH MATERIALIZED VIEW), which the trigger once took for
#      the engine's own write;
#      and one made as a replica (session_replication_role), as logical
#      replication's apply worker writes;
#   6. TRUNCATE and the rows written again.
# ENABLE TRIGGER ALL (as a restore ends) must leave the trigger firing ALWAYS,
# and another role's ALTER TABLE of its own table must not be touched (8).
#   7. ANALYZE, plain VACUUM (autovacuum's work), DDL in another database and
#      a session idle in a transaction with an xid leave totals kept.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_net.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
DB=stress
q() { psql -qXAt -v ON_ERROR_STOP=1 -d "$DB" -c "$1"; }
last_value() { session_sync "$1"; grep -v "^sync-" "$WORK/$1.out" | tail -n 1; }
cluster_create "$WORK/pg"
echo "shared_preload_libraries = 'sharded_seq'" >>"$PGDATA/postgresql.conf"
cluster_start
db_create stress

# is_kept NAME WANT: K reads counter NAME while counter_shards is locked ACCESS
# EXCLUSIVE: only a kept total can answer, and it must be WANT.
is_kept() {
    local got
    session_open L "$DB"
    session_send L "BEGIN; LOCK TABLE sharded_seq.counter_shards IN ACCESS EXCLUSIVE MODE; SELECT 1;"
    session_sync L
    session_send K "SET lock_timeout = '20s'; SELECT 'kept ' || counter_value('$1'); RESET lock_timeout;"
    got="$(last_value K)"
    session_send L "ROLLBACK;"
    session_close L
    [ "$got" = "kept $2" ] || fail "precondition: K did not keep $1 at $2 ($got; $(tail -n 2 "$WORK/K.err"))"
}
# keep NAME WANT: a new session K reads NAME until it keeps it (the second
# read keeps at the latest; a session that kept a pinned counter's total once
# reads its rows from their places afterwards, without keeping again), and T,
# in an open READ COMMITTED transaction, reads it too.
K_OPEN=""
keep() {
    [ -z "$K_OPEN" ] || session_close K
    session_open K "$DB"
    K_OPEN=1
    session_send K "SELECT counter_value('$1'); SELECT counter_value('$1'); SELECT counter_value('$1');"
    if [ "$(last_value K)" != "$2" ]; then
        echo "WRONG: a new session reads $(last_value K) of $1, not $2"; WRONG=$((WRONG + 1))
        return
    fi
    is_kept "$1" "$2"
    session_send T "BEGIN; SELECT counter_value('$1'); SELECT counter_value('$1');"
    [ "$(last_value T)" = "$2" ] || fail "T reads $(last_value T) of $1, not $2"
}
# all_read NAME WANT WHAT: K, T (next statement, same transaction, which then
# commits), a new session, and a new session under REPEATABLE READ read WANT.
all_read() {
    local k t n r
    session_send K "SELECT counter_value('$1');"
    k="$(last_value K)"
    session_send T "SELECT counter_value('$1'); COMMIT;"
    t="$(last_value T)"
    session_send T "SELECT 'after';"
    n="$(q "SELECT counter_value('$1')")"
    r="$(psql -qXAt -v ON_ERROR_STOP=1 -d "$DB" -c "BEGIN ISOLATION LEVEL REPEATABLE READ" \
         -c "SELECT counter_value('$1')" -c "COMMIT")"
    echo "RESULT $3: K reads $k, an open transaction $t, a new session $n, a new REPEATABLE READ one $r (want $2)"
    # every case runs, so that one run shows each that fails
    [ "$k" = "$2" ] && [ "$t" = "$2" ] && [ "$n" = "$2" ] && [ "$r" = "$2" ] ||
        { echo "WRONG: $3: a kept total hid a write"; WRONG=$((WRONG + 1)); }
}
WRONG=0
shard1() { echo "counter_id OPERATOR(pg_catalog.=) (SELECT id FROM sharded_seq.counter_config WHERE name = '$1') AND shard = 1"; }

echo "== 1. schema 1.2"
psql -qX -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE old12" >/dev/null
DB=old12
q "CREATE EXTENSION sharded_seq VERSION '1.2'"
q "SELECT sharded_seq.create_counter('k', 4)" >/dev/null
q "SELECT counter_incr('k', 10)" >/dev/null
session_open T old12
session_open K old12
K_OPEN=1
session_send K "SELECT counter_value('k'); SELECT counter_value('k'); SELECT counter_value('k');"
[ "$(last_value K)" = 10 ] || fail "K reads $(last_value K), not 10"
session_send T "BEGIN; SELECT counter_value('k'); SELECT counter_value('k');"
q "UPDATE sharded_seq.counter_shards SET value = value + 1000 WHERE $(shard1 k)"
all_read k 1010 "schema 1.2, an UPDATE by hand"
q "ALTER EXTENSION sharded_seq UPDATE"
all_read k 1010 "after ALTER EXTENSION UPDATE"
q "SELECT counter_incr('k', 5)" >/dev/null
keep k 1015
session_send T "COMMIT;"
session_close K
K_OPEN=""
session_close T

DB=stress
session_open T stress
# one counter per case, so that a case that goes wrong leaves the next alone
for c in c2 c3 c4 c5 c6 c7; do q "SELECT sharded_seq.create_counter('$c', shards => 4)" >/dev/null; done
q "SELECT sharded_seq.create_counter('a2', shards => NULL)" >/dev/null
q "SELECT counter_incr(name, 10) FROM unnest(ARRAY['c2','c3','c4','c5','c6','c7']) name" >/dev/null
q "SELECT counter_incr('a2', 7)" >/dev/null
# restart: a write by hand with the trigger in place stops all keeping for
# the server's life (NoteForeignRows); shared memory starts again
restart() {
    [ -z "$K_OPEN" ] || session_close K
    K_OPEN=""
    session_close T
    as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$CLUSTER_DIR/server.log" -m fast -w restart >/dev/null
    session_open T stress
}

echo "== 2. triggers disabled for one transaction"
keep c2 10
psql -qX -v ON_ERROR_STOP=1 -d stress >/dev/null <<SQL
BEGIN;
ALTER TABLE sharded_seq.counter_shards DISABLE TRIGGER ALL;
UPDATE sharded_seq.counter_shards SET value = value + 1000 WHERE $(shard1 c2);
ALTER TABLE sharded_seq.counter_shards ENABLE TRIGGER ALL;
COMMIT;
SQL
all_read c2 1010 "DISABLE TRIGGER ALL; UPDATE; ENABLE in one transaction"
keep a2 7
id="$(q "SELECT id FROM sharded_seq.counter_config WHERE name = 'a2'")"
psql -qX -v ON_ERROR_STOP=1 -d stress >/dev/null 2>&1 <<SQL
BEGIN;
ALTER TABLE sharded_seq.counter_shards DISABLE TRIGGER ALL;
DELETE FROM sharded_seq.counter_shards WHERE counter_id OPERATOR(pg_catalog.=) $id;
COPY sharded_seq.counter_shards (counter_id, shard, value) FROM stdin;
$id	0	300
$id	1	400
\\.
ALTER TABLE sharded_seq.counter_shards ENABLE TRIGGER ALL;
COMMIT;
SQL
all_read a2 700 "a restore's COPY with triggers disabled"
modes="$(q "SELECT string_agg(tgname || '=' || tgenabled::text, ' ' ORDER BY tgname) FROM pg_trigger
             WHERE tgrelid = 'sharded_seq.counter_shards'::regclass AND NOT tgisinternal")"
echo "RESULT after ENABLE TRIGGER ALL: $modes (want both A: ENABLE ALL means 'on origin', which replication's writes skip)"
[ "$modes" = "rows_changed_elsewhere=A rows_truncated_elsewhere=A" ] ||
    { echo "WRONG: ENABLE TRIGGER ALL left the triggers at $modes"; WRONG=$((WRONG + 1));
      q "ALTER TABLE sharded_seq.counter_shards ENABLE ALWAYS TRIGGER rows_changed_elsewhere" >/dev/null;
      q "ALTER TABLE sharded_seq.counter_shards ENABLE ALWAYS TRIGGER rows_truncated_elsewhere" >/dev/null; }

echo "== 3. a trigger disabled in a transaction of its own"
keep c3 10
q "ALTER TABLE sharded_seq.counter_shards DISABLE TRIGGER rows_changed_elsewhere"
session_send K "SELECT counter_value('c3'); SELECT counter_value('c3');"
[ "$(last_value K)" = 10 ] || fail "K reads $(last_value K), not 10"
q "UPDATE sharded_seq.counter_shards SET value = value + 1000 WHERE $(shard1 c3)"
session_send T "BEGIN; SELECT counter_value('c3');"
all_read c3 1010 "an UPDATE while the trigger is disabled"
q "ALTER TABLE sharded_seq.counter_shards ENABLE ALWAYS TRIGGER rows_changed_elsewhere"
keep c3 1010
session_send T "COMMIT;"
echo "RESULT with the trigger back, a session keeps the total again"

echo "== 4. VACUUM FULL and CLUSTER"
keep c4 10
q "VACUUM FULL sharded_seq.counter_shards"
q "SELECT counter_incr('c4', 1)" >/dev/null
all_read c4 11 "VACUUM FULL, then an increment"
keep c4 11
q "CLUSTER sharded_seq.counter_shards USING counter_shards_pkey"
q "SELECT counter_incr('c4', 1)" >/dev/null
all_read c4 12 "CLUSTER, then an increment"

echo "== 5. writes the trigger must see"
keep c5 10
psql -qX -v ON_ERROR_STOP=1 -d stress >/dev/null <<SQL
CREATE FUNCTION bump() RETURNS integer LANGUAGE sql AS
\$\$ UPDATE sharded_seq.counter_shards SET value = value + 1000 WHERE $(shard1 c5) RETURNING 1 \$\$;
CREATE MATERIALIZED VIEW bumped AS SELECT bump() WITH NO DATA;
REFRESH MATERIALIZED VIEW bumped;
SQL
all_read c5 1010 "REFRESH MATERIALIZED VIEW running the owner's UPDATE"
restart
keep c6 10
psql -qX -v ON_ERROR_STOP=1 -d stress -c "SET session_replication_role = replica" \
    -c "UPDATE sharded_seq.counter_shards SET value = value + 1000 WHERE $(shard1 c6)" >/dev/null
all_read c6 1010 "an UPDATE as a replica (session_replication_role), as the apply worker writes"

echo "== 6. TRUNCATE"
restart
keep c7 10
psql -qX -v ON_ERROR_STOP=1 -d stress >/dev/null <<SQL
BEGIN;
CREATE TEMP TABLE saved AS SELECT * FROM sharded_seq.counter_shards;
TRUNCATE sharded_seq.counter_shards;
INSERT INTO sharded_seq.counter_shards SELECT * FROM saved;
UPDATE sharded_seq.counter_shards SET value = value + 1000 WHERE $(shard1 c7);
COMMIT;
SQL
all_read c7 1010 "TRUNCATE and the rows written again"

echo "== 7. what changes no row leaves totals kept"
restart
q "SELECT sharded_seq.create_counter('c8', shards => 4)" >/dev/null
q "SELECT counter_incr('c8', 10)" >/dev/null
q "CREATE TABLE idle_t (a int)"
keep c8 10
session_send T "COMMIT;"
# a session idle in a transaction that has an xid, while statistics change
session_open I stress
session_send I "BEGIN; INSERT INTO idle_t VALUES (1);"
session_sync I
q "ANALYZE sharded_seq.counter_shards"
q "VACUUM sharded_seq.counter_shards"
psql -qX -v ON_ERROR_STOP=1 -d postgres -c "CREATE TABLE elsewhere (a int)" >/dev/null
session_send I "SELECT count(*) FROM idle_t;"
session_sync I
is_kept c8 10
echo "RESULT after ANALYZE, VACUUM and DDL elsewhere, with a session idle in a transaction that saw them, the total stays kept"
session_send I "COMMIT;"
session_close I
session_send T "COMMIT;"
session_close K
session_close T

echo "== 8. another role's ALTER TABLE of its own table"
# the trigger left firing on origin by a catalog update; a role that may not
# alter the extension's tables alters its own: nothing of ours may get in
# its way
q "CREATE ROLE alice LOGIN; GRANT CREATE ON SCHEMA public TO alice"
q "UPDATE pg_trigger SET tgenabled = 'O' WHERE tgname = 'rows_changed_elsewhere'"
psql -qX -v ON_ERROR_STOP=1 -U alice -d stress -c "CREATE TABLE alice_t (a int)" \
    -c "ALTER TABLE alice_t ADD COLUMN b int" >/dev/null 2>"$WORK/alice.err" ||
    fail "alice could not alter her own table: $(cat "$WORK/alice.err")"
mode="$(q "SELECT tgenabled FROM pg_trigger WHERE tgname = 'rows_changed_elsewhere'")"
echo "RESULT alice altered her own table; the trigger stays '$mode' until an ALTER TABLE of ours"
[ "$mode" = O ] || fail "an unrelated ALTER TABLE changed the trigger to $mode"
[ "$WRONG" = 0 ] || fail "$WRONG cases read a total that hid a write"
echo "kept totals safety net test passed"

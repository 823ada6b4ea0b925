#!/usr/bin/env bash
# Kept totals where rows change without this extension's marks (preloaded):
#   1. a prepared transaction that survives a restart (the words start again
#      at zero) is committed by COMMIT PREPARED: a session that kept the
#      total must see its increment;
#   2. on a hot standby, WAL replay changes rows: a standby session must see
#      every increment the primary commits;
#   3. a total read with a snapshot older than a commit (REPEATABLE READ)
#      must not be kept past it: the session's next transaction sees it;
#   4. totals shared between sessions (sharded_seq.shared_totals): a new
#      session must not take one that a commit has made old, nor one newer
#      than its snapshot; and new sessions reading while commits go on never
#      see a total outside the ledger written in the same transactions;
#   5. a database dropped and created again with the same OID from the same
#      template must not read the dropped one's shared totals;
#   6. after PREPARE TRANSACTION and COMMIT PREPARED, the counter's total is
#      kept again (it used to stay unkept until a restart).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_kept.XXXXXX)"
chmod 755 "$WORK"
STANDBY=""
trap '[ -n "$STANDBY" ] && as_pg "$PGBIN/pg_ctl" -D "$STANDBY" -m immediate stop >/dev/null 2>&1; cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
q() { psql -qXAt -v ON_ERROR_STOP=1 -d stress -c "$1"; }
last_value() { session_sync "$1"; grep -v "^sync-" "$WORK/$1.out" | tail -n 1; }
cluster_create "$WORK/pg"
cat >>"$PGDATA/postgresql.conf" <<'CONF'
shared_preload_libraries = 'sharded_seq'
wal_level = replica
CONF
echo "host replication all 127.0.0.1/32 trust" >>"$PGDATA/pg_hba.conf"
cluster_start
db_create stress

echo "== 1. COMMIT PREPARED of a transaction from before a restart"
q "SELECT sharded_seq.create_counter('c', shards => 4)" >/dev/null
q "SELECT counter_incr('c', 1)" >/dev/null
psql -qX -v ON_ERROR_STOP=1 -d stress -c "BEGIN" -c "SELECT counter_incr('c', 100)" -c "PREPARE TRANSACTION 'p1'" >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$CLUSTER_DIR/server.log" -m fast -w restart >/dev/null
session_open R
session_send R "SELECT counter_value('c'); SELECT counter_value('c'); SELECT counter_value('c'); SELECT counter_value('c');"
[ "$(last_value R)" = 1 ] || fail "R reads $(last_value R) before COMMIT PREPARED, not 1"
q "COMMIT PREPARED 'p1'" >/dev/null
q "SELECT txid_current()" >/dev/null
session_send R "SELECT counter_value('c');"
got="$(last_value R)"
echo "RESULT after COMMIT PREPARED of a transaction prepared before a restart, R reads $got (want 101)"
[ "$got" = 101 ] || fail "a kept total hid a prepared transaction's increment"
session_close R

echo "== 2. a hot standby"
STANDBY="$WORK/standby"
mkdir -m 700 "$STANDBY"
[ "$(id -u)" = 0 ] && chown postgres: "$STANDBY"
as_pg "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "$PGPORT" -U postgres -D "$STANDBY" -R -X stream >/dev/null
SPORT="$(free_port)"
cat >>"$STANDBY/postgresql.conf" <<CONF
port = $SPORT
hot_standby = on
CONF
as_pg "$PGBIN/pg_ctl" -D "$STANDBY" -l "$CLUSTER_DIR/standby.log" -w start >/dev/null
PRIMARY_PORT="$PGPORT"
export PGPORT="$SPORT"
session_open S
export PGPORT="$PRIMARY_PORT"
session_send S "SELECT counter_value('c'); SELECT counter_value('c'); SELECT counter_value('c'); SELECT counter_value('c');"
[ "$(last_value S)" = 101 ] || fail "the standby session reads $(last_value S), not 101"
for want in 201 301; do
    q "SELECT counter_incr('c', 100)" >/dev/null
    lsn="$(q "SELECT pg_current_wal_lsn()")"
    for _ in $(seq 1 100); do
        [ "$(psql -qXAt -p "$SPORT" -d stress -c "SELECT pg_last_wal_replay_lsn() >= '$lsn'")" = t ] && break
        sleep 0.1
    done
    session_send S "SELECT counter_value('c');"
    got="$(last_value S)"
    echo "RESULT after an increment on the primary, the standby session reads $got (want $want)"
    [ "$got" = "$want" ] || fail "a standby session kept a total that replay had changed"
done
session_close S

echo "== 3. a snapshot older than a commit"
q "SELECT counter_incr('r', 5)" >/dev/null
for name in r c; do
    before="$(q "SELECT counter_value('$name')")"
    session_open O
    # the snapshot is taken by SELECT 1, before the other session's commit
    session_send O "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;"
    session_sync O
    q "SELECT counter_incr('$name', 1000)" >/dev/null
    session_send O "SELECT counter_value('$name'); SELECT counter_value('$name'); SELECT counter_value('$name');"
    [ "$(last_value O)" = "$before" ] || fail "the old snapshot reads $(last_value O) of $name, not $before"
    session_send O "COMMIT; SELECT counter_value('$name'); SELECT counter_value('$name');"
    got="$(last_value O)"
    echo "RESULT $name after a transaction whose snapshot predates a commit, the session reads $got (want $((before + 1000)))"
    [ "$got" = "$((before + 1000))" ] || fail "a total read with an old snapshot was kept past a commit"
    session_close O
done

echo "== 4. totals shared between sessions"
q "SELECT counter_incr('s', 7)" >/dev/null
# a first session keeps the total (and shares it)
q "SELECT counter_value('s'), counter_value('s')" >/dev/null
psql -qXAt -d stress -c "SELECT counter_value('s')" -c "SELECT counter_value('s')" >/dev/null
q "SELECT counter_incr('s', 1000)" >/dev/null
got="$(q "SELECT counter_value('s')")"
echo "RESULT a new session after a commit reads $got (want 1007)"
[ "$got" = 1007 ] || fail "a new session took a shared total that a commit had made old"
session_open O
session_send O "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;"
session_sync O
q "SELECT counter_incr('s', 1000)" >/dev/null
# another session keeps the newer total
psql -qXAt -d stress -c "SELECT counter_value('s')" -c "SELECT counter_value('s')" >/dev/null
session_send O "SELECT counter_value('s');"
got="$(last_value O)"
echo "RESULT a snapshot older than the shared total reads $got (want 1007)"
[ "$got" = 1007 ] || fail "a session took a shared total newer than its snapshot"
session_send O "COMMIT;"
session_close O

psql -qX -v ON_ERROR_STOP=1 -d stress >/dev/null <<'SQL'
CREATE TABLE ledger (c int, d bigint);
CREATE TABLE seen_wrong (c int, lo bigint, v bigint, hi bigint);
SELECT counter_incr('k' || g, 0) FROM generate_series(1, 20) g;
SQL
cat >"$WORK/write.sql" <<'SQL'
\set i random(1, 20)
\set d random(1, 9)
BEGIN;
SELECT counter_incr('k' || :i, :d);
INSERT INTO ledger VALUES (:i, :d);
COMMIT;
SQL
# read committed: each statement's snapshot is newer than the one before
cat >"$WORK/read.sql" <<'SQL'
\set i random(1, 20)
SELECT coalesce(sum(d), 0) AS lo FROM ledger WHERE c = :i \gset
SELECT counter_value('k' || :i) AS v \gset
SELECT coalesce(sum(d), 0) AS hi FROM ledger WHERE c = :i \gset
INSERT INTO seen_wrong SELECT :i, :lo, :v, :hi WHERE :v < :lo OR :v > :hi;
SQL
pgbench -n -c 4 -j 2 -T 8 -f "$WORK/write.sql" stress >"$WORK/write.log" 2>&1 &
writers=$!
# -C: a new session for every read, which meets the counter for the first time
pgbench -n -C -c 4 -j 2 -T 8 -f "$WORK/read.sql" stress >"$WORK/read.log" 2>&1 || fail "readers: $(tail -3 "$WORK/read.log")"
wait "$writers" || fail "writers: $(tail -3 "$WORK/write.log")"
reads="$(awk '/^number of transactions actually processed/ {print $NF}' "$WORK/read.log")"
wrong="$(q "SELECT count(*) FROM seen_wrong")"
differ="$(q "SELECT count(*) FROM generate_series(1, 20) g
             WHERE counter_value('k' || g) <> (SELECT coalesce(sum(d), 0) FROM ledger WHERE c = g)")"
echo "RESULT $reads reads from new sessions during commits: $wrong outside the ledger; $differ counters differ from it after"
[ "${reads:-0}" -gt 100 ] || fail "too few reads ($reads) to mean anything"
[ "$wrong" = 0 ] || fail "a new session read a total outside the ledger: $(q "SELECT * FROM seen_wrong LIMIT 3")"
[ "$differ" = 0 ] || fail "$differ counters differ from the ledger"

echo "== 5. a database created again with the same OID"
psql -qX -v ON_ERROR_STOP=1 -d postgres >/dev/null <<'SQL'
CREATE DATABASE tmpl;
\c tmpl
CREATE EXTENSION sharded_seq;
SELECT sharded_seq.create_counter('c', shards => 4);
SELECT counter_incr('c', 5);
\c postgres
CREATE DATABASE again TEMPLATE tmpl OID 70000;
\c again
SELECT counter_incr('c', 1000);
SQL
# keep (and share) the total of the first database "again"
psql -qXAt -d again -c "SELECT counter_value('c')" -c "SELECT counter_value('c')" -c "SELECT counter_value('c')" >/dev/null
psql -qX -v ON_ERROR_STOP=1 -d postgres -c "DROP DATABASE again" -c "CREATE DATABASE again TEMPLATE tmpl OID 70000" >/dev/null
got="$(psql -qXAt -d again -c "SELECT counter_value('c')")"
echo "RESULT the new database with the dropped one's OID reads $got (want 5)"
[ "$got" = 5 ] || fail "a database read the shared total of a dropped database with its OID"

echo "== 6. PREPARE TRANSACTION leaves the word settled"
q "SELECT counter_incr('p', 1)" >/dev/null
psql -qX -v ON_ERROR_STOP=1 -d stress -c "BEGIN" -c "SELECT counter_incr('p', 10)" -c "PREPARE TRANSACTION 'p2'" >/dev/null
q "COMMIT PREPARED 'p2'" >/dev/null
session_open R
session_send R "SELECT counter_value('p'); SELECT counter_value('p');"
[ "$(last_value R)" = 11 ] || fail "R reads $(last_value R) after COMMIT PREPARED, not 11"
# a kept total reads no row: it needs no lock on counter_shards
session_open L
session_send L "BEGIN; LOCK TABLE sharded_seq.counter_shards IN ACCESS EXCLUSIVE MODE; SELECT 1;"
session_sync L
session_send R "SET lock_timeout = '1s'; SELECT 'locked ' || counter_value('p');"
got="$(last_value R)"
session_send L "ROLLBACK;"
session_close L
echo "RESULT after PREPARE and COMMIT PREPARED, with counter_shards locked, R reads '$got' (want 'locked 11', from its kept total)"
[ "$got" = "locked 11" ] || fail "a counter whose increment was prepared is not kept again ($(tail -2 "$WORK/R.err" 2>/dev/null))"
session_close R
echo "kept totals test passed"

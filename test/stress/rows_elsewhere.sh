#!/usr/bin/env bash
# Rows and claims written outside the engine, as logical replication's apply
# worker writes them (plain INSERT and DELETE; here by a superuser, with
# session_replication_role = replica as in the apply worker):
#   1. a node-0 session that read a counter from its remembered rows must
#      count another node's rows once they arrive;
#   2. a node-5 session that checked its claim must be refused once the claim
#      is replaced by another system's, as new sessions are.
# Run twice: without the library preloaded, and preloaded.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_elsewhere.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
q() { psql -qXAt -v ON_ERROR_STOP=1 -d "${DB:-stress}" -c "$1"; }
last_value() { session_sync "$1"; grep -v "^sync-" "$WORK/$1.out" | tail -n 1; }
# as the apply worker: replica role, plain DML
as_replication() { psql -qXAt -v ON_ERROR_STOP=1 -d stress -c "SET session_replication_role = replica" -c "$1" >/dev/null; }

for preload in no yes; do
    echo "== library preloaded: $preload"
    cluster_create "$WORK/pg_$preload"
    [ $preload = yes ] && echo "shared_preload_libraries = 'sharded_seq'" >>"$PGDATA/postgresql.conf"
    cluster_start
    db_create stress

    echo "-- 1. another node's rows arrive at node 0"
    q "SELECT sharded_seq.create_counter('pinned', shards => 4), sharded_seq.create_counter('adapt')" >/dev/null
    session_open A
    for c in pinned adapt; do
        session_send A "SELECT counter_incr('$c', 10);"
        session_send A "SELECT counter_value('$c'); SELECT counter_value('$c');"
        [ "$(last_value A)" = 10 ] || fail "$c reads $(last_value A) before, not 10"
    done
    as_replication "INSERT INTO sharded_seq.counter_shards SELECT id, 1024, 1000 FROM sharded_seq.counter_config"
    for c in pinned adapt; do
        session_send A "SELECT counter_value('$c');"
        got="$(last_value A)"
        echo "RESULT $c read by a session that had remembered its rows: $got (want 1010)"
        [ "$got" = 1010 ] || fail "$c: a session missed another node's row"
        session_send A "SELECT counter_incr('$c', 1);"
        [ "$(last_value A)" = 1011 ] || fail "$c: counter_incr returned $(last_value A), not 1011"
    done
    session_close A

    echo "-- 2. this node's claim replaced by another system's"
    psql -qXAt -d stress -c "LOAD 'sharded_seq'" -c "ALTER SYSTEM SET sharded_seq.node_id = 5" >/dev/null
    q "SELECT pg_reload_conf()" >/dev/null
    sleep 0.5
    DB=postgres q "CREATE DATABASE n5" >/dev/null
    DB=n5 q "CREATE EXTENSION sharded_seq" >/dev/null
    DB=n5 q "SELECT sharded_seq.create_sequence('s'), sharded_seq.create_counter('c')" >/dev/null
    session_open B n5
    session_send B "SELECT sharded_seq.node_id(), sharded_nextval('s') >= 5 * 2^53;"
    [ "$(last_value B)" = "5|t" ] || fail "B does not draw as node 5: $(last_value B)"
    psql -qXAt -v ON_ERROR_STOP=1 -d n5 -c "SET session_replication_role = replica" \
        -c "BEGIN" -c "DELETE FROM sharded_seq.node_claims WHERE node_id = 5" \
        -c "INSERT INTO sharded_seq.node_claims VALUES (5, '7999999999999999999', 'n5', now())" -c "COMMIT" >/dev/null
    new="$(psql -qXAt -d n5 -c "SELECT sharded_nextval('s')" 2>&1 | grep -o "ERROR:.*claimed by system 7999999999999999999" || true)"
    [ -n "$new" ] || fail "a new session was not refused"
    for stmt in "SELECT sharded_nextval('s');" "SELECT counter_incr('c');" "SELECT sharded_seq.create_counter('made_while_refused');"; do
        session_send B "$stmt"
        session_sync B
        grep -q "claimed by system 7999999999999999999" "$WORK/B.err" ||
            fail "the session that had checked its claim went on: $stmt"
        : >"$WORK/B.err"
    done
    echo "RESULT a session that had checked its claim is refused once it is replaced, as new sessions are"
    session_close B
    psql -qXAt -d stress -c "LOAD 'sharded_seq'" -c "ALTER SYSTEM RESET sharded_seq.node_id" >/dev/null
    cluster_destroy >/dev/null 2>&1
done
echo "rows elsewhere test passed"

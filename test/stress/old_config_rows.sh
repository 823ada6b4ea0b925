#!/usr/bin/env bash
# Counters whose config rows are older than the commit log PostgreSQL keeps.
# After enough transactions, VACUUM freezes the rows and truncates pg_xact;
# a counter's config row xid must not be looked up there again (it used to
# raise "could not access status of transaction" on every read that trusted
# remembered rows or a kept total), nor that of a counter a session created
# and then left alone.  pg_resetwal -x moves the next xid to the end of the
# second commit log segment, as after two million transactions, and a few
# thousand more cross into the third.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_oldcfg.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
qd() { psql -qXAt -v ON_ERROR_STOP=1 -d "$1" -c "$2"; }

run() {
    local preload="$1"
    cluster_create "$WORK/pg$preload"
    [ "$preload" = yes ] && echo "shared_preload_libraries = 'sharded_seq'" >>"$PGDATA/postgresql.conf"
    cluster_start
    db_create stress
    qd stress "SELECT sharded_seq.create_counter('pinned', shards => 4)" >/dev/null
    qd stress "SELECT counter_incr('pinned', 5), counter_incr('adaptive', 7)" >/dev/null
    cluster_stop fast
    as_pg "$PGBIN/pg_resetwal" -x 2096000 -D "$PGDATA" >/dev/null
    as_pg dd if=/dev/zero of="$PGDATA/pg_xact/0001" bs=8192 count=32 status=none
    cluster_start
    # a session creates a counter, then leaves it alone
    session_open S stress
    session_send S "SELECT counter_incr('mine', 3);"
    session_sync S
    echo "SELECT txid_current();" >"$WORK/xid.sql"
    pgbench -n -c 2 -t 1300 -f "$WORK/xid.sql" stress >/dev/null 2>&1
    qd postgres "ALTER DATABASE template0 ALLOW_CONNECTIONS true"
    for d in template0 template1 postgres stress; do qd "$d" "VACUUM FREEZE"; done
    qd postgres "ALTER DATABASE template0 ALLOW_CONNECTIONS false"
    qd stress "CHECKPOINT"
    [ ! -e "$PGDATA/pg_xact/0000" ] && [ ! -e "$PGDATA/pg_xact/0001" ] \
        || fail "VACUUM FREEZE left $(ls "$PGDATA/pg_xact" | tr '\n' ' '): the test proves nothing"
    out="$(psql -qXAt -v ON_ERROR_STOP=1 -d stress \
        -c "SELECT counter_value('pinned'), counter_value('adaptive')" \
        -c "SELECT counter_value('pinned'), counter_value('adaptive')" \
        -c "SELECT counter_value('pinned'), counter_value('adaptive')" \
        -c "SELECT counter_incr('pinned', 1), counter_incr('adaptive', 1)" \
        -c "SELECT counter_value('pinned'), counter_value('adaptive')" 2>&1 | tr '\n' ' ')" \
        || fail "preload=$preload: $out"
    session_send S "SELECT 'mine ' || counter_value('mine'); SELECT 'mine ' || counter_incr('mine', 1);"
    session_sync S
    mine="$(grep -v '^sync-' "$WORK/S.out" | { grep '^mine' || true; } | tr '\n' ' ')"
    session_close S
    echo "RESULT preload=$preload, the session that created a counter, after the commit log dropped that xid: $mine(want mine 3 mine 4)"
    [ "$mine" = "mine 3 mine 4 " ] || fail "preload=$preload: the creating session fails: $(grep ERROR "$WORK/S.err" | tail -1)"
    echo "RESULT preload=$preload, config rows older than the commit log: $out(want 5|7 5|7 5|7 6|8 6|8)"
    [ "$out" = "5|7 5|7 5|7 6|8 6|8 " ] || fail "preload=$preload: wrong totals"
    cluster_destroy >/dev/null 2>&1
}
run no
run yes
echo "old config rows test passed"

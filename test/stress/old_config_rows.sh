#!/usr/bin/env bash
# Counters whose config rows are older than the commit log PostgreSQL keeps.
# After enough transactions, VACUUM freezes the rows and truncates pg_xact;
# a counter's config row xid must not be looked up there again (it used to
# raise "could not access status of transaction" on every read that trusted
# remembered rows or a kept total).  pg_resetwal -x moves the next xid past
# two commit log segments, as after two million transactions.
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
    as_pg "$PGBIN/pg_resetwal" -x 3000000 -D "$PGDATA" >/dev/null
    as_pg dd if=/dev/zero of="$PGDATA/pg_xact/0002" bs=8192 count=32 status=none
    cluster_start
    qd postgres "ALTER DATABASE template0 ALLOW_CONNECTIONS true"
    for d in template0 template1 postgres stress; do qd "$d" "VACUUM FREEZE"; done
    qd postgres "ALTER DATABASE template0 ALLOW_CONNECTIONS false"
    [ ! -e "$PGDATA/pg_xact/0000" ] || fail "VACUUM FREEZE left pg_xact/0000: the test proves nothing"
    out="$(psql -qXAt -v ON_ERROR_STOP=1 -d stress \
        -c "SELECT counter_value('pinned'), counter_value('adaptive')" \
        -c "SELECT counter_value('pinned'), counter_value('adaptive')" \
        -c "SELECT counter_value('pinned'), counter_value('adaptive')" \
        -c "SELECT counter_incr('pinned', 1), counter_incr('adaptive', 1)" \
        -c "SELECT counter_value('pinned'), counter_value('adaptive')" 2>&1 | tr '\n' ' ')" \
        || fail "preload=$preload: $out"
    echo "RESULT preload=$preload, config rows older than the commit log: $out(want 5|7 5|7 5|7 6|8 6|8)"
    [ "$out" = "5|7 5|7 5|7 6|8 6|8 " ] || fail "preload=$preload: wrong totals"
    cluster_destroy >/dev/null 2>&1
}
run no
run yes
echo "old config rows test passed"

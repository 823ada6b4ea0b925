#!/usr/bin/env bash
# maintain() rewriting a counter's rows while alter_counter or drop_counter
# runs on it.  A counter is spread over several pages (rows added while the
# others are held by prepared transactions, with filler counters between),
# so that maintain() gathers it; an open transaction holds maintain()'s
# work while the administrative call starts.  The alter must keep the total;
# the drop must leave no row behind; and commits with increments of the
# dropped counter must fail cleanly, not crash.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_maint.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
cluster_create "$WORK/pg"
cluster_start
db_create stress
q() { psql -X -q -A -t -v ON_ERROR_STOP=1 -d stress -c "$1"; }
fail() { echo "FAILED: $*"; exit 1; }

spread() {  # spread COUNTER TAG HELD: one more row, on a later page
    q "SELECT count(sharded_seq.create_counter('f$1$2_' || i)) FROM generate_series(1, 300) i" >/dev/null
    for h in $(seq 1 "$3"); do
        psql -X -q -d stress -c "BEGIN; SELECT counter_incr('$1', 1000); PREPARE TRANSACTION '$1_$2_$h';" >/dev/null
    done
    q "SELECT counter_incr('$1', 100)" >/dev/null   # every row held: a new one
    for h in $(seq 1 "$3"); do q "ROLLBACK PREPARED '$1_$2_$h'" >/dev/null; done
}
make_spread() {  # make_spread COUNTER: total 210 over three rows on three pages
    q "SELECT sharded_seq.create_counter('$1')" >/dev/null
    q "SELECT counter_incr('$1', 10)" >/dev/null
    spread "$1" a 1
    spread "$1" b 2
    [ "$(q "SELECT shards FROM sharded_seq.counters WHERE name = '$1'")" = 3 ] || fail "$1 did not grow to 3 rows"
    [ "$(q "SELECT counter_value('$1')")" = 210 ] || fail "$1 does not start at 210"
}
race() {  # race SQL: maintain() holds its work open while SQL starts
    session_open m
    session_open a
    session_send m "BEGIN; SELECT folded, compacted FROM sharded_seq.maintain();"
    session_sync m
    session_send a "$1"
    sleep 1
    session_send m "COMMIT;"
    session_sync m
    session_sync a
    session_close m
    session_close a
}

make_spread c1
race "SELECT sharded_seq.alter_counter('c1', shards => 2);"
grep -q '|1$' "$WORK/m.out" || { cat "$WORK/m.out"; fail "maintain() did not gather the counter: test is void"; }
total=$(q "SELECT counter_value('c1')")
echo "RESULT alter_counter racing a gather: total $total (want 210), rows $(q "SELECT shards FROM sharded_seq.counters WHERE name = 'c1'")"
[ "$total" = 210 ] || fail "the total changed"

make_spread c2
# increments of c2 waiting to commit (or prepare) when it is dropped
session_open late1
session_open late2
session_send late1 "BEGIN; SELECT counter_incr('c2', 1);"
session_send late2 "BEGIN; SELECT counter_incr('c2', 1);"
session_sync late1
session_sync late2
race "SELECT sharded_seq.drop_counter('c2');"
left=$(q "SELECT count(*) FROM sharded_seq.counter_shards s WHERE NOT EXISTS
            (SELECT FROM sharded_seq.counter_config c WHERE c.id = s.counter_id)")
echo "RESULT drop_counter racing a gather: $left rows left without a counter"
[ "$left" = 0 ] || fail "rows outlived their counter"
session_send late1 "COMMIT;"
session_send late2 "PREPARE TRANSACTION 'late2';"
session_sync late1
session_sync late2
session_close late1
session_close late2
for s in late1 late2; do
    grep -q "was dropped before this transaction committed" "$WORK/$s.err" || {
        cat "$WORK/$s.err"; fail "$s: a commit to the dropped counter did not fail as it should"; }
done
left=$(q "SELECT count(*) FROM sharded_seq.counter_shards s WHERE NOT EXISTS
            (SELECT FROM sharded_seq.counter_config c WHERE c.id = s.counter_id)")
[ "$left" = 0 ] || fail "increments wrote rows of a dropped counter"
q "SELECT 1" >/dev/null || fail "the server is gone"
echo "RESULT a commit and a PREPARE with increments of the dropped counter failed cleanly; the server is up"

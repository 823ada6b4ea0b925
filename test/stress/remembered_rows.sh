#!/usr/bin/env bash
# C1 for reads that skip the index.  With the library preloaded, a session
# remembers where an adaptive counter's rows are and reads them there while
# the counter's layout word stands still.  Two orderings that would fool a
# careless version, each driven step by step from two sessions:
#   1. growth: session R has remembered one row; a commit that finds that row
#      held adds a second one; R must count it;
#   2. an older snapshot: R, in REPEATABLE READ, read two rows; maintain()
#      folds them into one and R (same transaction) remembers the new layout
#      with a fresh snapshot; R's own snapshot must not be read through it;
#   3. R keeps a counter's rows and total (adaptive and pinned); another
#      session's increment must show in R's next read.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_remembered.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
cluster_create "$WORK/pg"
cat >>"$PGDATA/postgresql.conf" <<'CONF'
shared_preload_libraries = 'sharded_seq'
sharded_seq.counter_fold_after = 1
# the worker stays out of the way: maintain() runs when the test says
sharded_seq.counter_flush_interval = 3600
CONF
cluster_start
db_create stress
fail() { echo "FAILED: $*"; exit 1; }
q() { psql -qXAt -v ON_ERROR_STOP=1 -d stress -c "$1"; }
rows() { q "SELECT shards FROM sharded_seq.counters WHERE name = '$1'"; }
# last_value NAME: the last line session NAME printed
last_value() { session_sync "$1"; grep -v "^sync-" "$WORK/$1.out" | tail -n 1; }
# grow NAME DELTA: add DELTA while another transaction holds every row of NAME
grow() {
    session_open H
    session_send H "BEGIN; SELECT shard FROM sharded_seq.counter_shards WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = '$1') FOR UPDATE;"
    session_sync H
    q "SELECT counter_incr('$1', $2)" >/dev/null
    session_send H "ROLLBACK;"
    session_close H
}

echo "== 1. growth after R remembered the rows"
q "SELECT counter_incr('g', 1)" >/dev/null
[ "$(rows g)" = 1 ] || fail "g should start as one row"
session_open R
session_send R "SELECT counter_value('g'); SELECT counter_value('g');"
[ "$(last_value R)" = 1 ] || fail "R reads $(last_value R), not 1"
grow g 5
[ "$(rows g)" = 2 ] || fail "the held row did not make g grow: test is void"
session_send R "SELECT counter_value('g');"
got="$(last_value R)"
echo "RESULT after growth R reads $got (want 6)"
[ "$got" = 6 ] || fail "R missed the row added after it remembered the rows"
session_send R "SELECT counter_value('g');"
[ "$(last_value R)" = 6 ] || fail "R's second read after growth is $(last_value R)"

echo "== 2. a REPEATABLE READ snapshot older than the remembered rows"
q "SELECT counter_incr('f', 10)" >/dev/null
grow f 20
[ "$(rows f)" = 2 ] || fail "f did not grow: test is void"
session_send R "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT counter_value('f');"
[ "$(last_value R)" = 30 ] || fail "R reads $(last_value R), not 30"
# fold f back to one row: rows idle since the previous pass are folded
for _ in $(seq 1 20); do
    q "SELECT sharded_seq.maintain()" >/dev/null
    [ "$(rows f)" = 1 ] && break
    sleep 0.6
done
[ "$(rows f)" = 1 ] || fail "maintain() did not fold f: test is void"
q "SELECT counter_incr('f', 100)" >/dev/null
[ "$(q "SELECT counter_value('f')")" = 130 ] || fail "f is not 130 after the fold"
# R's first read after the fold sees the new word and remembers the new row;
# the next reads must still answer for R's snapshot
session_send R "SELECT counter_value('f'); SELECT counter_value('f'); SELECT counter_value('f');"
session_sync R
got="$(grep -v "^sync-" "$WORK/R.out" | tail -n 3 | tr '\n' ' ')"
echo "RESULT R's snapshot from before the fold reads: $got(want 30 30 30)"
[ "$got" = "30 30 30 " ] || fail "R read through rows remembered with a newer snapshot"
session_send R "COMMIT; SELECT counter_value('f');"
[ "$(last_value R)" = 130 ] || fail "R after COMMIT reads $(last_value R), not 130"

echo "== 3. an increment after R kept the rows and their total"
q "SELECT counter_incr('k', 3)" >/dev/null
q "SELECT sharded_seq.create_counter('kp', shards => 4)" >/dev/null
q "SELECT counter_incr('kp', 3)" >/dev/null
for c in k kp; do
    # three reads: the second keeps the rows and total, the third uses them
    session_send R "SELECT counter_value('$c'); SELECT counter_value('$c'); SELECT counter_value('$c');"
    [ "$(last_value R)" = 3 ] || fail "R reads $c as $(last_value R), not 3"
    q "SELECT counter_incr('$c', 4)" >/dev/null
    session_send R "SELECT counter_value('$c');"
    got="$(last_value R)"
    echo "RESULT $c after another session's increment, R reads $got (want 7)"
    [ "$got" = 7 ] || fail "R read $c from a total kept before an increment"
done
session_close R
echo "remembered rows test passed"

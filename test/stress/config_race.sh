#!/usr/bin/env bash
# E1 and S1: a configuration read that races a change is never taken for
# current.  Session B is stopped by gdb inside its configuration read, after
# its snapshot was taken; an alter_sequence and an alter_counter commit
# meanwhile, and their invalidations reach B while the read goes on.  B must
# then still see the new layout: no value twice (B against a session drawing
# from the new layout), no block reserved from the retired shards.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_race.XXXXXX)"
chmod 755 "$WORK"
GDB_PID=""
trap '[ -n "$GDB_PID" ] && kill $GDB_PID 2>/dev/null; cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
command -v gdb >/dev/null || { echo "gdb is missing: run scripts/setup.sh"; exit 1; }
cluster_create "$WORK/pg"
cluster_start
db_create stress
fail() { echo "FAILED: $*"; exit 1; }
q() { psql -qXAt -d stress -c "$1"; }

q "SELECT sharded_seq.create_sequence('rc', shards => 2, block => 5)" >/dev/null
q "SELECT sharded_seq.create_counter('rcc', shards => 2)" >/dev/null

session_open B
session_send B "SELECT sharded_nextval('rc'); SELECT counter_value('rcc'); SELECT pg_backend_pid();"
session_sync B
B_PID=$(tail -n 2 "$WORK/B.out" | head -1)
[ -n "$B_PID" ] || fail "no backend pid for session B"
# an invalidation, so that B's next call reads its configuration again
q "SELECT sharded_seq.grant_sequence('rc', 'public'), sharded_seq.grant_counter('rcc', 'public')" >/dev/null

# stop_in_config_read TAG BREAKPOINT: gdb stops B at its next configuration
# read, once its snapshot is taken; it touches $WORK/stopped.TAG there, and
# lets B go on when $WORK/go.TAG appears.  Sequences read through SPI,
# counters directly (FetchCounterConfig), so each has its own breakpoint.
stop_in_config_read() {
    gdb -q -p "$B_PID" -batch \
        -ex 'set pagination off' \
        -ex "break $2" \
        -ex 'continue' \
        -ex "shell touch $WORK/stopped.$1; while [ ! -f $WORK/go.$1 ]; do sleep 0.05; done" \
        -ex 'delete' \
        -ex 'detach' >"$WORK/gdb.$1.log" 2>&1 &
    GDB_PID=$!
    for _ in $(seq 1 200); do grep -q "^Breakpoint 1 at" "$WORK/gdb.$1.log" && break; sleep 0.05; done
    grep -q "^Breakpoint 1 at" "$WORK/gdb.$1.log" || { cat "$WORK/gdb.$1.log"; fail "gdb did not attach"; }
}
stopped() {  # stopped TAG: wait until B is stopped in its configuration read
    for _ in $(seq 1 200); do [ -f "$WORK/stopped.$1" ] && return 0; sleep 0.05; done
    cat "$WORK/gdb.$1.log"; fail "session B never reached its configuration read"
}
go_on() { touch "$WORK/go.$1"; wait "$GDB_PID" || true; GDB_PID=""; }

stop_in_config_read seq SPI_execute_snapshot

session_send B "SELECT sharded_nextval('rc') FROM generate_series(1, 30);"
stopped seq
echo "RESULT session B stopped inside its configuration read"

# the change commits while B is stopped with its old snapshot
q "SELECT sharded_seq.alter_sequence('rc', shards => 3, block => 7)" >/dev/null
retired_state() {
    q "SELECT coalesce(string_agg(coalesce(pg_sequence_last_value(s.relid), -1)::text, ',' ORDER BY s.shard), 'none')
         FROM sharded_seq.sequence_shards s JOIN sharded_seq.sequence_config c ON c.id = s.seq_id
        WHERE c.name = 'rc' AND s.generation < c.generation"
}
retired_before=$(retired_state)
go_on seq
session_sync B
q "SELECT sharded_nextval('rc') FROM generate_series(1, 30)" >"$WORK/other.out"
session_send B "SELECT sharded_nextval('rc') FROM generate_series(1, 30);"
session_sync B
grep -v '^sync-' "$WORK/B.out" | tail -n 60 >"$WORK/b.out"
[ -s "$WORK/B.err" ] && { cat "$WORK/B.err"; fail "session B got an error"; }
python3 "$HERE/check_values.py" "$WORK/b.out" "$WORK/other.out"

# B reserves nothing from the retired generation's shards
retired_after=$(retired_state)
[ "$retired_after" = "$retired_before" ] || fail "retired shards reserved blocks after the alter ($retired_before -> $retired_after)"
echo "RESULT no block was reserved from a retired shard"
high=$(q "SELECT generation_start FROM sharded_seq.sequences WHERE name = 'rc'")
below=$(awk -v h="$high" '$1 < h' "$WORK/b.out" | wc -l)
echo "RESULT session B: $below of 60 values below the new generation's start $high (its block from before the alter)"
[ "$below" -le 5 ] || fail "session B kept drawing from the old layout"

# the same race for a counter: a shard change committed during the read
session_send B "SELECT counter_value('rcc');"
session_sync B
q "SELECT sharded_seq.grant_counter('rcc', 'public', 'select')" >/dev/null
stop_in_config_read ctr 'systable_beginscan if $_caller_is("FetchCounterConfig")'
session_send B "BEGIN; SELECT counter_incr('rcc', 5);"
stopped ctr
q "SELECT sharded_seq.alter_counter('rcc', shards => 1)" >/dev/null
go_on ctr
session_send B "COMMIT;"
session_sync B
session_close B
[ -s "$WORK/B.err" ] && { cat "$WORK/B.err"; fail "session B got an error"; }
total=$(q "SELECT counter_value('rcc')")
[ "$total" = 5 ] || fail "counter total $total after a shard change raced its configuration read, want 5"
echo "RESULT counter: total exact (5) across a shard change committed during the read"

#!/usr/bin/env bash
# C2: a clean shutdown (pg_ctl stop -m fast) loses no committed increment of
# a write-behind counter in shared memory, whatever the timing of the
# commits and flushes around it.  The server preloads sharded_seq, with the
# flush interval an hour: only the worker's flush at shutdown writes the
# rows.  Each committed increment also writes its delta to a ledger in the
# same transaction; after each restart every counter equals its ledger.
#   1. a commit held by gdb at PinSlot, after it asked whether the worker
#      takes amounts (before 1.4: between that check and its pin, the gap
#      of issue 18), while the server stops; let go once the worker has
#      gone or says it waits;
#   2. a commit held right after it reserved its slot (pinned, before its
#      commit), 'buffered' and 'memcached' batched through shared memory:
#      the worker must wait for it however long it is held;
#   3. a flush_counters() held after it took a slot's amount, its
#      transaction then ended by the shutdown, which gives the amount back:
#      the worker must wait for it too;
#   4. without gdb: sessions commit increments (a one-shard counter among
#      them, whose single row a commit that goes to the rows holds) while
#      the server stops, five rounds.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_shutdown.XXXXXX)"
chmod 755 "$WORK"
GDB_PID=""
STOP_PID=""
MC_PORT="$(free_port)"
memcached_start "$MC_PORT" >/dev/null
trap '[ -n "$GDB_PID" ] && kill $GDB_PID 2>/dev/null; [ -n "$STOP_PID" ] && wait $STOP_PID 2>/dev/null; memcached_kill; cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
command -v gdb >/dev/null || { echo "gdb is missing: run scripts/setup.sh"; exit 1; }
cluster_create "$WORK/pg"
cat >>"$PGDATA/postgresql.conf" <<CONF
shared_preload_libraries = 'sharded_seq'
sharded_seq.memcached_servers = '127.0.0.1:$MC_PORT'
sharded_seq.counter_flush_interval = 3600
CONF
cluster_start
db_create stress
q() { psql -qXAt -v ON_ERROR_STOP=1 -d stress -c "$1"; }
fail() { echo "FAIL: $*"; exit 1; }
worker_settled stress || fail "no worker in database stress"

psql -qX -v ON_ERROR_STOP=1 -d stress >/dev/null <<'SQL'
SELECT sharded_seq.create_counter('b', mode => 'buffered');
SELECT sharded_seq.create_counter('b1', shards => 1, mode => 'buffered');
SELECT sharded_seq.create_counter('m', mode => 'memcached');
CREATE TABLE ledger (counter text, delta bigint);
SQL

# check WHAT: every counter's total against its ledger
check() {
    psql -qX -d stress -At -F ' ' >"$WORK/check.txt" <<'SQL'
SELECT c.name, counter_value(c.name), (SELECT coalesce(sum(delta), 0) FROM ledger l WHERE l.counter = c.name),
       (SELECT count(*) FROM ledger l WHERE l.counter = c.name)
  FROM sharded_seq.counters c ORDER BY 1;
SQL
    while read -r name total ledger rows; do
        echo "RESULT $1: counter $name total=$total ledger=$ledger committed increments=$rows"
    done <"$WORK/check.txt"
    awk '$2 != $3 {bad=1} END {exit bad}' "$WORK/check.txt" || fail "$1: a total differs from its ledger"
}
ledger_rows() { q "SELECT count(*) FROM ledger WHERE counter = '$1'"; }
worker_pid() { q "SELECT pid FROM sharded_seq.workers WHERE database = 'stress' AND running"; }
stop_fast() { as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w -t 120 stop >/dev/null; }
start() { cluster_start; worker_settled stress || fail "no worker after the restart"; }
# session_end NAME: session_close for a session whose server may have gone
# (its psql then exited: a write to its fifo must not end this script)
session_end() {
    local fd pid
    eval "fd=\$SESSION_FD_$1; pid=\$SESSION_PID_$1"
    ( trap '' PIPE; printf '\\q\n' >&"$fd" ) 2>/dev/null || true
    eval "exec $fd>&-"
    unset "SESSION_FD_$1"
    wait "$pid" 2>/dev/null || true
}

# held TAG BREAKPOINT FINISH SETUP_SQL HELD_SQL: a session runs SETUP_SQL,
# then HELD_SQL with gdb stopping it at BREAKPOINT (and, with FINISH=finish,
# at that function's return).  The server then stops -m fast.  The session
# is let go once the worker has exited or logs that it waits (a condition,
# not a sleep), the stop completes, and the server starts again.
held() {
    local tag="$1" bp="$2" fin="$3" setup="$4" sql="$5" pid wpid from seen="" gdb_fin=()
    [ "$fin" = finish ] && gdb_fin=(-ex finish)
    session_open "S$tag"
    session_send "S$tag" "$setup SELECT 'pid', pg_backend_pid();"
    session_sync "S$tag"
    pid=$(sed -n 's/^pid|//p' "$WORK/S$tag.out" | tail -n 1)
    [ -n "$pid" ] || fail "$tag: no backend pid"
    wpid=$(worker_pid)
    [ -n "$wpid" ] || fail "$tag: no worker"
    gdb -q -p "$pid" -batch \
        -ex 'set pagination off' \
        -ex "break $bp" \
        -ex 'continue' \
        "${gdb_fin[@]}" \
        -ex "shell touch $WORK/stopped.$tag; while [ ! -f $WORK/go.$tag ]; do sleep 0.05; done" \
        -ex 'delete' \
        -ex 'detach' >"$WORK/gdb.$tag.log" 2>&1 &
    GDB_PID=$!
    for _ in $(seq 1 200); do grep -q "^Breakpoint 1 at" "$WORK/gdb.$tag.log" && break; sleep 0.05; done
    grep -q "^Breakpoint 1 at" "$WORK/gdb.$tag.log" || { cat "$WORK/gdb.$tag.log"; fail "$tag: gdb did not attach"; }
    session_send "S$tag" "$sql"
    for _ in $(seq 1 200); do [ -f "$WORK/stopped.$tag" ] && break; sleep 0.05; done
    [ -f "$WORK/stopped.$tag" ] || { cat "$WORK/gdb.$tag.log"; fail "$tag: the session never reached $bp"; }
    from=$(( $(wc -l <"$CLUSTER_DIR/server.log") + 1 ))
    stop_fast &
    STOP_PID=$!
    for _ in $(seq 1 1200); do
        if tail -n +"$from" "$CLUSTER_DIR/server.log" | grep -q "waits for .* before its last flush"; then
            seen="the worker waited for it"; break
        fi
        kill -0 "$wpid" 2>/dev/null || { seen="the worker had exited"; break; }
        sleep 0.05
    done
    [ -n "$seen" ] || fail "$tag: the worker neither exited nor said it waits within 60 s"
    touch "$WORK/go.$tag"
    wait "$GDB_PID" || true
    GDB_PID=""
    wait "$STOP_PID" || fail "$tag: pg_ctl stop -m fast failed"
    STOP_PID=""
    session_end "S$tag"
    start
    echo "RESULT $tag: held at $bp${fin:+ ($fin)} through pg_ctl stop -m fast, let go when $seen"
}

echo "== 1. a commit held at PinSlot"
q "BEGIN; INSERT INTO ledger VALUES ('b', 1); SELECT counter_incr('b', 1); COMMIT;" >/dev/null
held pin PinSlot "" "" "BEGIN; INSERT INTO ledger VALUES ('b', 7); SELECT counter_incr('b', 7); COMMIT;"
echo "RESULT pin: the held commit $( [ "$(ledger_rows b)" = 2 ] && echo committed || echo 'was rolled back')"
check "a commit held at PinSlot"

echo "== 2. a commit held after it reserved its slot"
for c in b m; do
    held "reserved_$c" SlotReserve finish "" "BEGIN; INSERT INTO ledger VALUES ('$c', 5); SELECT counter_incr('$c', 5); COMMIT;"
    check "a '$c' commit held after its reservation"
done

echo "== 3. a flush_counters() held after it took an amount"
q "BEGIN; INSERT INTO ledger VALUES ('b', 11); SELECT counter_incr('b', 11); COMMIT;" >/dev/null
[ "$(q "SELECT pending FROM sharded_seq.counters WHERE name = 'b'")" = 11 ] || fail "b's amount is not waiting in shared memory: test is void"
held flush CounterApply "" "" "BEGIN; SELECT sharded_seq.flush_counters();"
check "a flush_counters() held after its take, ended by the shutdown"

echo "== 4. sessions commit while the server stops"
load() {  # load PHASE SESSION: increments of the three counters, 20% rolled back
    python3 - "$@" <<'PY'
import random, sys
rnd = random.Random(hash(tuple(sys.argv[1:])))
for i in range(100000):
    stmts = []
    for _ in range(rnd.choice([1, 2])):
        name = rnd.choice(["b", "b", "b1", "m"])
        d = rnd.randint(1, 9)
        stmts.append(f"INSERT INTO ledger VALUES ('{name}', {d}); SELECT counter_incr('{name}', {d});")
    end = "ROLLBACK" if rnd.randrange(100) < 20 else "COMMIT"
    print("BEGIN; " + " ".join(stmts) + f" {end};")
PY
}
for round in 1 2 3 4 5; do
    rows=$(q "SELECT count(*) FROM ledger")
    run_sessions stress "r$round" 4 load
    for _ in $(seq 1 600); do
        [ "$(q "SELECT count(*) >= $rows + 300 FROM ledger")" = t ] && break
        sleep 0.05
    done
    pending=$(q "SELECT coalesce(sum(pending), 0) FROM sharded_seq.counters")
    stop_fast
    wait_sessions
    sessions_cut_off "r$round" 4 || fail "round $round: the load ended before the shutdown"
    echo "RESULT round $round: $pending pending in shared memory as the server stopped"
    [ "$pending" -gt 0 ] || fail "round $round: nothing pending in shared memory: test is void"
    start
    check "round $round"
done
echo "shutdown_flush stress test passed"

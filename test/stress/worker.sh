#!/usr/bin/env bash
# The background worker and mode 'buffered' (C2), on a server with
# sharded_seq in shared_preload_libraries and a real memcached:
#   1. clean restart under load: 8 sessions, some transactions rolled back,
#      the flush interval an hour, pg_ctl restart -m fast: the total is exact
#      (only the worker's flush at shutdown can have written it);
#   2. a quiet counter: increments, more than two intervals of quiet, then an
#      immediate shutdown: exact.  The same for mode 'memcached', followed by
#      memcached flush_all;
#   3. immediate shutdown under load: the total is at most the committed sum,
#      and at least what was committed up to a few intervals before;
#   4. the worker alone killed with SIGKILL: the server restarts it, and no
#      total is above the committed sum;
#   5. a full slot table: commits go to the rows, nothing is lost;
#   6. the worker's life: CREATE/DROP EXTENSION, CREATE DATABASE from its
#      database, DROP DATABASE, a round that fails (its error shown in the
#      workers view, then the amount flushed), pg_terminate_backend;
#   7. no worker process free for the database: commits go to the rows, and
#      a clean restart loses nothing;
#   8. the library taken out of shared_preload_libraries: no error, nothing
#      lost, and no warning for its setting left in postgresql.conf.
# Each committed increment also writes its delta to a ledger in the same
# transaction.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
SESSIONS=8
WORK="$(mktemp -d /tmp/ss_worker.XXXXXX)"
chmod 755 "$WORK"
MC_PORT="$(free_port)"
memcached_start "$MC_PORT" >/dev/null
trap 'memcached_kill; cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
cluster_create "$WORK/pg"
cat >>"$PGDATA/postgresql.conf" <<CONF
shared_preload_libraries = 'sharded_seq'
sharded_seq.memcached_servers = '127.0.0.1:$MC_PORT'
sharded_seq.counter_flush_interval = 1
CONF
cluster_start
db_create stress
q() { psql -qXAt -v ON_ERROR_STOP=1 -d "${DB:-stress}" -c "$1"; }
fail() { echo "FAIL: $*"; exit 1; }
restart() { as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$CLUSTER_DIR/server.log" -m fast -w -t 60 restart >/dev/null; }
set_interval() { q "ALTER SYSTEM SET sharded_seq.counter_flush_interval = '$1'" >/dev/null; q "SELECT pg_reload_conf()" >/dev/null; sleep 0.5; }
# wait_for SECONDS SQL: until SQL returns t
wait_for() {
    for _ in $(seq 1 $(( $1 * 10 ))); do
        [ "$(q "$2" 2>/dev/null)" = t ] && return 0
        sleep 0.1
    done
    return 1
}
worker_running() { wait_for "${2:-10}" "SELECT coalesce(bool_or(running), false) FROM sharded_seq.workers WHERE database = '$1'"; }

psql -qX -v ON_ERROR_STOP=1 -d stress <<'SQL'
SELECT sharded_seq.create_counter('buf', mode => 'buffered');
SELECT sharded_seq.create_counter('buf4', shards => 4, mode => 'buffered');
SELECT sharded_seq.create_counter('mc', mode => 'memcached');
CREATE TABLE ledger (counter text, delta bigint, at timestamptz DEFAULT clock_timestamp());
SQL
worker_running stress || fail "no worker in database stress"

script() {  # script TRANSACTIONS PHASE SESSION: increments, 25% rolled back
    python3 - "$@" <<'PY'
import random, sys
n, phase, session = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
rnd = random.Random(hash((phase, session)))
out = []
for i in range(n):
    stmts = []
    for _ in range(rnd.choice([1, 1, 2])):
        d = rnd.randint(-2, 9)
        name = rnd.choice(["buf", "buf", "buf4"])
        stmts.append(f"SELECT counter_incr('{name}', {d}); INSERT INTO ledger (counter, delta) VALUES ('{name}', {d});")
    end = "ROLLBACK" if rnd.randrange(100) < 25 else "COMMIT"
    out.append("BEGIN; " + " ".join(stmts) + f" {end};")
print("\n".join(out))
PY
}
# check OP: every counter's total against its ledger, with OP (= or <=)
check() {
    psql -qX -d stress -At -F ' ' >"$WORK/check.txt" <<'SQL'
SELECT c.name, counter_value(c.name), (SELECT coalesce(sum(delta), 0) FROM ledger l WHERE l.counter = c.name),
       (SELECT count(*) FROM ledger l WHERE l.counter = c.name)
  FROM sharded_seq.counters c WHERE c.name IN ('buf', 'buf4') ORDER BY 1;
SQL
    while read -r name total ledger rows; do
        echo "RESULT $2: counter $name total=$total ledger=$ledger committed increments=$rows"
    done <"$WORK/check.txt"
    case "$1" in
        =)  awk '$2 != $3 {bad=1} END {exit bad}' "$WORK/check.txt" || fail "$2: a total differs from the ledger" ;;
        \<=) awk '$2 > $3 {bad=1} END {exit bad}' "$WORK/check.txt" || fail "$2: a total is above the ledger" ;;
    esac
}

echo "== 1. clean restart under load, nothing flushed before it"
set_interval 3600
q "SELECT sharded_seq.flush_counters()" >/dev/null
q "TRUNCATE ledger" >/dev/null
base="$(q "SELECT counter_value('buf') + counter_value('buf4')")"
[ "$base" = 0 ] || fail "counters should start at 0, not $base"
run_sessions stress p1 $SESSIONS script 40000
sleep 4
pending="$(q "SELECT sum(pending) FROM sharded_seq.counters WHERE name IN ('buf', 'buf4')")"
echo "RESULT before the restart: $pending pending in shared memory"
[ "$pending" -gt 1000 ] || fail "too little pending before the restart: test is void"
restart
wait_sessions
sessions_cut_off p1 $SESSIONS
check = "after pg_ctl restart -m fast"
[ "$(q "SELECT sum(pending) FROM sharded_seq.counters")" = 0 ] || fail "pending left after a clean restart"

echo "== 2. a quiet counter: flushed within two intervals"
set_interval 1
worker_running stress || fail "no worker after the restart"
q "TRUNCATE ledger" >/dev/null
q "SELECT sharded_seq.flush_counters()" >/dev/null
q "UPDATE sharded_seq.counter_shards SET value = 0" >/dev/null
run_sessions stress p2 4 script 300
wait_sessions
sleep 2.5
cluster_stop immediate
cluster_start
check = "a quiet buffered counter after an immediate shutdown"
before="$(q "SELECT counter_value('mc')")"
for i in $(seq 1 200); do q "SELECT counter_incr('mc', 3)" >/dev/null; done
sleep 2.5
memcached_cmd "$MC_PORT" flush_all >/dev/null
after="$(q "SELECT counter_value('mc')")"
echo "RESULT a quiet memcached counter, then flush_all: $before -> $after (600 added)"
[ "$after" = $((before + 600)) ] || fail "a quiet memcached counter lost increments to flush_all"

echo "== 3. immediate shutdown under load"
q "TRUNCATE ledger" >/dev/null
q "UPDATE sharded_seq.counter_shards SET value = 0" >/dev/null
run_sessions stress p3 $SESSIONS script 100000
sleep 8
crash_at="$(date +%s.%N)"
cluster_stop immediate
wait_sessions
sessions_cut_off p3 $SESSIONS
cluster_start
check "<=" "after an immediate shutdown"
# the worker flushes every second: what was committed 3 s before the crash is in
read -r total floor <<<"$(q "SELECT (SELECT sum(counter_value(name)) FROM sharded_seq.counters WHERE name IN ('buf', 'buf4')),
                                   (SELECT coalesce(sum(delta), 0) FROM ledger WHERE at < to_timestamp($crash_at) - interval '3 s')" | tr '|' ' ')"
echo "RESULT after an immediate shutdown: total $total, committed up to 3 s before the crash $floor"
[ "$floor" -gt 1000 ] || fail "too little committed before the crash: test is void"
[ "$total" -ge "$floor" ] || fail "the immediate shutdown lost more than the last intervals"

echo "== 4. the worker killed with SIGKILL"
q "TRUNCATE ledger" >/dev/null
q "UPDATE sharded_seq.counter_shards SET value = 0" >/dev/null
worker_running stress || fail "no worker after the crash"
run_sessions stress p4 $SESSIONS script 100000
sleep 3
wpid="$(q "SELECT pid FROM sharded_seq.workers WHERE database = 'stress'")"
kill -9 "$wpid"
wait_sessions
sessions_cut_off p4 $SESSIONS
for _ in $(seq 1 100); do q "SELECT 1" >/dev/null 2>&1 && break; sleep 0.2; done
check "<=" "after the worker was killed"
worker_running stress 20 || fail "the worker did not come back after SIGKILL"
newpid="$(q "SELECT pid FROM sharded_seq.workers WHERE database = 'stress'")"
echo "RESULT the worker $wpid was killed; the server restarted it as $newpid"
[ "$newpid" != "$wpid" ] || fail "the worker still has its old pid"

echo "== 5. a full slot table"
q "ALTER SYSTEM SET sharded_seq.buffered_slots = 16" >/dev/null
restart
q "TRUNCATE ledger" >/dev/null
q "SELECT count(sharded_seq.create_counter('many_' || g, mode => 'buffered')) FROM generate_series(1, 40) g" >/dev/null
many() {  # many PHASE SESSION
    python3 - "$@" <<'PY'
import random, sys
rnd = random.Random(hash(tuple(sys.argv[1:])))
for i in range(400):
    name = f"many_{rnd.randint(1, 40)}"
    d = rnd.randint(1, 5)
    end = "ROLLBACK" if rnd.randrange(100) < 20 else "COMMIT"
    print(f"BEGIN; SELECT counter_incr('{name}', {d}); INSERT INTO ledger (counter, delta) VALUES ('{name}', {d}); {end};")
PY
}
run_sessions stress p5 4 many
wait_sessions
if grep -v -h "^$" "$WORK"/p5.*.err | grep -q .; then cat "$WORK"/p5.*.err | head; fail "errors with a full slot table"; fi
read -r used total refused <<<"$(q "SELECT used, total, refused FROM sharded_seq.buffered_slots()" | tr '|' ' ')"
echo "RESULT slot table: $used of $total used, $refused commits refused a slot"
[ "$refused" -gt 0 ] || fail "the slot table never filled: test is void"
[ "$used" -le "$total" ] || fail "more slots used than exist"
sleep 2.5
q "SELECT sharded_seq.flush_counters()" >/dev/null
bad="$(q "SELECT count(*) FROM (SELECT counter, sum(delta) s FROM ledger GROUP BY counter) l WHERE counter_value(l.counter) <> l.s")"
sum="$(q "SELECT sum(counter_value(c.name)) || ' ' || (SELECT sum(delta) FROM ledger) FROM sharded_seq.counters c WHERE c.name LIKE 'many_%'")"
echo "RESULT 40 counters through 16 slots: totals and ledger $sum, $bad counters off"
[ "$bad" = 0 ] || fail "counters lost increments with a full slot table"
q "ALTER SYSTEM RESET sharded_seq.buffered_slots" >/dev/null
restart

echo "== 6. the worker's life"
worker_running stress || fail "no worker after the restart"
q "CREATE DATABASE w2" >/dev/null
DB=w2 q "CREATE EXTENSION sharded_seq" >/dev/null
worker_running w2 || fail "no worker after CREATE EXTENSION"
start=$(date +%s%N)
q "CREATE DATABASE w3 TEMPLATE w2" >/dev/null || fail "CREATE DATABASE from a database with a worker failed"
echo "RESULT CREATE DATABASE w3 TEMPLATE w2 took $(( ($(date +%s%N) - start) / 1000000 )) ms"
worker_running w2 || fail "the worker did not come back after CREATE DATABASE"
# a database cloned after the launcher's start, used only through the
# administration (a view, flush_counters): that use alone gets it a worker
DB=w3 q "SELECT count(*) FROM sharded_seq.counters" >/dev/null
DB=w3 q "SELECT sharded_seq.flush_counters()" >/dev/null
worker_running w3 || fail "no worker in w3, used only through the counters view and flush_counters()"
echo "RESULT w3, a clone used only through a view and flush_counters(), got its worker"
DB=w2 q "DROP EXTENSION sharded_seq" >/dev/null
wait_for 10 "SELECT NOT coalesce(bool_or(running), false) FROM sharded_seq.workers WHERE database = 'w2'" ||
    fail "the worker stayed after DROP EXTENSION"
DB=w2 q "CREATE EXTENSION sharded_seq" >/dev/null
DB=w2 q "SELECT sharded_seq.create_counter('x', mode => 'buffered'); SELECT counter_incr('x', 5)" >/dev/null
worker_running w2 || fail "no worker after CREATE EXTENSION again"
wait_for 10 "SELECT 1 = 1" >/dev/null
DB=w2 wait_for 10 "SELECT sum(value) = 5 FROM sharded_seq.counter_shards" || fail "w2's counter was not flushed"
# a role that may not drop the database must not stop its worker either
w2pid="$(q "SELECT pid FROM sharded_seq.workers WHERE database = 'w2'")"
q "CREATE ROLE nobody_much LOGIN" >/dev/null
psql -qXAt -U nobody_much -d stress -c "DROP DATABASE w2" >/dev/null 2>&1 && fail "a role without rights dropped w2"
sleep 0.5
[ "$(q "SELECT pid FROM sharded_seq.workers WHERE database = 'w2'")" = "$w2pid" ] ||
    fail "a failed DROP DATABASE by a role without rights stopped w2's worker"
# DROP and CREATE EXTENSION in one session, then in one transaction block
DB=w2 psql -qXAt -v ON_ERROR_STOP=1 -d w2 >/dev/null <<'SQL'
DROP EXTENSION sharded_seq;
SELECT pg_sleep(2);
CREATE EXTENSION sharded_seq;
SELECT sharded_seq.create_counter('y', mode => 'buffered');
SQL
worker_running w2 || fail "no worker after DROP and CREATE EXTENSION in one session"
DB=w2 psql -qXAt -v ON_ERROR_STOP=1 -d w2 >/dev/null <<'SQL'
DROP EXTENSION sharded_seq;
SELECT pg_sleep(2);
BEGIN;
CREATE EXTENSION sharded_seq;
SELECT pg_sleep(1.5);
SELECT sharded_seq.create_counter('y', mode => 'buffered');
COMMIT;
SQL
worker_running w2 || fail "no worker after CREATE EXTENSION in a transaction block"
DB=w2 q "SELECT counter_incr('y', 9)" >/dev/null
DB=w2 wait_for 10 "SELECT sum(value) = 9 FROM sharded_seq.counter_shards" || fail "w2's counter y was not flushed"
# a dropped database's slots are freed
DB=w2 q "SELECT counter_incr('y', 1)" >/dev/null
used_before="$(q "SELECT used FROM sharded_seq.buffered_slots()")"
start=$(date +%s%N)
q "DROP DATABASE w2" >/dev/null || fail "DROP DATABASE failed with a worker in it"
echo "RESULT DROP DATABASE w2 took $(( ($(date +%s%N) - start) / 1000000 )) ms"
q "DROP DATABASE w3" >/dev/null
wait_for 10 "SELECT used < $used_before FROM sharded_seq.buffered_slots()" || fail "the dropped database's slots stay in use"
echo "RESULT slots in use: $used_before before DROP DATABASE w2, $(q "SELECT used FROM sharded_seq.buffered_slots()") after"

# a prepared transaction holding one counter's row holds up no other counter
q "SELECT sharded_seq.create_counter('held', shards => 1, mode => 'buffered')" >/dev/null
psql -qXAt -v ON_ERROR_STOP=1 -d stress -c "BEGIN" -c "SELECT counter_incr('held', -1)" -c "PREPARE TRANSACTION 'holds_a_row'" >/dev/null
q "SELECT counter_incr('held', 5), counter_incr('buf', 13)" >/dev/null
wait_for 10 "SELECT pending = 0 FROM sharded_seq.counters WHERE name = 'buf'" ||
    fail "a prepared transaction holding another counter's row held up the flush"
[ "$(q "SELECT pending FROM sharded_seq.counters WHERE name = 'held'")" = 5 ] || fail "held's amount is not waiting in shared memory"
q "COMMIT PREPARED 'holds_a_row'" >/dev/null
wait_for 10 "SELECT pending = 0 AND total = 4 FROM sharded_seq.counters WHERE name = 'held'" || fail "held was not flushed once its row was free"
echo "RESULT a prepared transaction held one counter's row: the others were flushed, and it was once the row was free"

# a round that fails: its error shows, and a later round flushes
q "SELECT counter_incr('buf', 11)" >/dev/null
session_open locker
session_send locker "BEGIN; LOCK TABLE sharded_seq.counter_shards IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(3); COMMIT;"
wait_for 10 "SELECT last_error IS NOT NULL FROM sharded_seq.workers WHERE database = 'stress'" ||
    fail "a failed round left no error in the workers view"
echo "RESULT the workers view shows: $(q "SELECT last_error FROM sharded_seq.workers WHERE database = 'stress'")"
session_sync locker
session_close locker
wait_for 10 "SELECT pending = 0 FROM sharded_seq.counters WHERE name = 'buf'" || fail "no flush after the failed round"

wpid="$(q "SELECT pid FROM sharded_seq.workers WHERE database = 'stress'")"
q "SELECT counter_incr('buf', 1)" >/dev/null
start=$(date +%s%N)
q "SELECT pg_terminate_backend($wpid)" >/dev/null
for _ in $(seq 1 100); do kill -0 "$wpid" 2>/dev/null || break; sleep 0.05; done
ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "RESULT the worker stopped $ms ms after SIGTERM"
kill -0 "$wpid" 2>/dev/null && fail "the worker did not stop on SIGTERM"
[ "$ms" -lt 2000 ] || fail "the worker took $ms ms to stop"
wait_for 10 "SELECT coalesce(bool_or(running AND pid <> $wpid), false) FROM sharded_seq.workers WHERE database = 'stress'" ||
    fail "the launcher did not start the worker again"

echo "== 7. no worker in the database: commits go to the rows"
# the logical replication launcher and ours take both worker processes
q "ALTER SYSTEM SET max_worker_processes = 2" >/dev/null
restart
sleep 2
[ "$(q "SELECT count(*) FROM sharded_seq.workers WHERE running AND kind = 'worker'")" = 0 ] || fail "a worker runs without a free process"
q "TRUNCATE ledger" >/dev/null
q "UPDATE sharded_seq.counter_shards SET value = 0" >/dev/null
run_sessions stress p6 4 script 300
wait_sessions
[ "$(q "SELECT coalesce(sum(pending), 0) FROM sharded_seq.counters")" = 0 ] || fail "amounts wait in shared memory with no worker to flush them"
restart
check = "with no worker, after pg_ctl restart -m fast"
q "ALTER SYSTEM RESET max_worker_processes" >/dev/null
restart

echo "== 8. the library taken out of shared_preload_libraries"
q "TRUNCATE ledger" >/dev/null
q "SELECT sharded_seq.flush_counters()" >/dev/null
q "UPDATE sharded_seq.counter_shards SET value = 0" >/dev/null
run_sessions stress p7 4 script 300
wait_sessions
sed -i "s/^shared_preload_libraries = 'sharded_seq'/shared_preload_libraries = ''/" "$PGDATA/postgresql.conf"
# a setting of the preloaded library left behind draws no warning
echo "sharded_seq.buffered_slots = 1024" >>"$PGDATA/postgresql.conf"
restart
psql -qXAt -d stress -c "SELECT counter_value('buf')" 2>"$WORK/warn.txt" >/dev/null
grep -q WARNING "$WORK/warn.txt" && { cat "$WORK/warn.txt"; fail "a session warns about sharded_seq.buffered_slots"; }
[ "$(q "SHOW shared_preload_libraries")" = "" ] || fail "still preloaded"
run_sessions stress p7b 4 script 300
wait_sessions
if grep -v -h "^$" "$WORK"/p7b.*.err | grep -q .; then cat "$WORK"/p7b.*.err | head; fail "errors once no longer preloaded"; fi
check = "after leaving shared_preload_libraries"
echo "RESULT without preload the workers view says: $(q "SELECT last_error FROM sharded_seq.workers")"
echo "worker stress test passed"

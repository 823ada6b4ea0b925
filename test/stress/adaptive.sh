#!/usr/bin/env bash
# C1 for adaptive counters: a counter created by counter_incr grows under
# contention, maintain() folds and gathers its rows while increments and
# readers go on, the idle counter ends as one row, and an immediate shutdown
# in the middle of it all loses nothing committed.  Every increment writes its
# delta to a ledger in the same transaction, so the total must equal the
# ledger's sum exactly; readers check that in every statement (READ
# COMMITTED) and across statements (REPEATABLE READ), and fail loudly if not.
# The server preloads the library, so those reads go through remembered rows.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_adaptive.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
cluster_create "$WORK/pg"
echo "sharded_seq.counter_fold_after = 1" >>"$PGDATA/postgresql.conf"
# preloaded: reads then skip the index while an adaptive counter's layout word
# stands still, and the background worker runs maintain() too
echo "shared_preload_libraries = 'sharded_seq'" >>"$PGDATA/postgresql.conf"
cluster_start
db_create stress
psql -qX -d stress -c "CREATE TABLE ledger (counter text, delta bigint)" >/dev/null
# pgbench's load: the same transaction as incr() below, a fifth rolled back
cat >"$WORK/incr.pgbench" <<'SQL'
\set d random(-3, 10)
\set r random(1, 5)
BEGIN;
SELECT counter_incr('hot', :d);
INSERT INTO ledger VALUES ('hot', :d);
\if :r = 1
ROLLBACK;
\else
COMMIT;
\endif
SQL

incr() {  # incr TRANSACTIONS SLEEP PHASE SESSION
    python3 - "$@" <<'PY'
import random, sys
n, pause, phase, session = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
rnd = random.Random(hash((phase, session)))
for i in range(n):
    stmts = []
    for _ in range(rnd.choice([1, 1, 2])):
        d = rnd.randint(-3, 10)
        stmts.append(f"SELECT counter_incr('hot', {d}); INSERT INTO ledger VALUES ('hot', {d});")
    end = "ROLLBACK" if rnd.randrange(100) < 20 else "COMMIT"
    print("BEGIN; " + " ".join(stmts) + f" {end};" + (f" SELECT pg_sleep({pause});" if pause != "0" else ""))
PY
}
# A reader fails with division_by_zero when the total and the ledger differ.
CHECK="SELECT 1 / (counter_value('hot') = (SELECT coalesce(sum(delta), 0) FROM ledger WHERE counter = 'hot'))::int;"
read_loop() {  # read_loop COUNT PHASE SESSION
    for _ in $(seq 1 "$1"); do
        echo "$CHECK"
        echo "BEGIN ISOLATION LEVEL REPEATABLE READ; $CHECK SELECT pg_sleep(0.02); $CHECK COMMIT;"
    done
}
maintain_loop() {  # maintain_loop COUNT PHASE SESSION
    for _ in $(seq 1 "$1"); do echo "SELECT folded, compacted FROM sharded_seq.maintain(); SELECT pg_sleep(0.1);"; done
}
rows() { psql -qXAt -d stress -c "SELECT shards FROM sharded_seq.counters WHERE name = 'hot'"; }
check_total() {
    psql -qXAt -F ' ' -d stress -c "SELECT counter_value('hot'), (SELECT coalesce(sum(delta), 0) FROM ledger WHERE counter = 'hot'),
                                           (SELECT count(*) FROM ledger WHERE counter = 'hot')" >"$WORK/total"
    read -r total ledger n <"$WORK/total"
    echo "RESULT $1: total=$total ledger=$ledger committed increments=$n rows=$(rows)"
    [ "$total" = "$ledger" ] || { echo "the total differs from the ledger"; exit 1; }
}
no_errors() {  # no_errors PHASE...: fail on any error a session reported
    local f
    for f in "$@"; do
        if grep -v -h "^$" "$WORK"/$f.*.err 2>/dev/null | grep -q .; then
            echo "errors in $f:"; cat "$WORK"/$f.*.err | sort | uniq -c | head; exit 1
        fi
    done
}

echo "phase 1: 16 sessions on a counter that counter_incr creates; it must grow"
pgbench -n -c 16 -j 2 -t 500 -f "$WORK/incr.pgbench" stress >"$WORK/grow.out" 2>&1 || {
    echo "pgbench failed:"; tail "$WORK/grow.out"; exit 1; }
grown=$(rows)
check_total grow
[ "$grown" -ge 4 ] || { echo "the counter did not grow under contention ($grown rows)"; exit 1; }

echo "phase 2: increments, readers and maintain() at once"
run_sessions stress load 4 incr 400 0.005
load_pids=("${SESSION_PIDS[@]}")
run_sessions stress read 2 read_loop 150
read_pids=("${SESSION_PIDS[@]}")
run_sessions stress maint 1 maintain_loop 40
SESSION_PIDS+=("${load_pids[@]}" "${read_pids[@]}")
wait_sessions
no_errors load read maint
moved=$(awk -F'|' '{f += $1; c += $2} END {print f + c}' "$WORK"/maint.1.out)
echo "RESULT maintain() during the load: $moved counters folded or gathered"
[ "$moved" -gt 0 ] || { echo "maintain() did nothing during the load: test is void"; exit 1; }
check_total load

echo "phase 3: idle; two fold passes bring it back to one row"
sleep 1.2
psql -qX -d stress -c "SELECT sharded_seq.maintain()" >/dev/null
sleep 1.2
psql -qX -d stress -c "SELECT sharded_seq.maintain()" >/dev/null
check_total idle
[ "$(rows)" = 1 ] || { echo "the idle counter was not folded back to one row"; exit 1; }

echo "phase 4: growth and folding under load, then an immediate shutdown"
pgbench -n -c 16 -j 2 -T 60 -f "$WORK/incr.pgbench" stress >"$WORK/crash.out" 2>&1 &
bench=$!
run_sessions stress cmaint 1 maintain_loop 1000
sleep 4
cluster_stop immediate
wait_sessions
wait $bench && { echo "the load ended before the crash: test is void"; exit 1; }
grep -q -i "connection\|terminat\|server closed" "$WORK/crash.out" || {
    echo "pgbench did not stop on the crash:"; tail "$WORK/crash.out"; exit 1; }
cluster_start
check_total crash

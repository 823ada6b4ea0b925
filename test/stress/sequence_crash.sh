#!/usr/bin/env bash
# S1 and S2 under load: 8 sessions draw at once, committing some draws and
# rolling back others, through (1) an immediate shutdown, (2) a backend killed
# with SIGKILL (crash recovery), and (3) online alter_sequence and
# advance_sequence.  Every value any session received is then checked: none
# repeats, and each session's values strictly increase.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
SESSIONS=8
WORK="$(mktemp -d /tmp/ss_seq_crash.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
cluster_create "$WORK/pg"
cluster_start
db_create stress
psql -qX -d stress -c "SELECT sharded_seq.create_sequence('s', shards => 4, block => 20)" >/dev/null
# the same workload on a native sequence, for comparison only
psql -qX -d stress -c "CREATE SEQUENCE native_s" >/dev/null

# script ROLLBACK_PERCENT TRANSACTIONS PHASE SESSION: a psql script
script() {
    python3 - "$@" <<'PY'
import random, sys
rb, n, phase, session = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
rnd = random.Random(hash((phase, session)))
out = []
for i in range(n):
    draws = rnd.choice([1, 1, 1, 2, 5])
    end = "ROLLBACK" if rnd.randrange(100) < rb else "COMMIT"
    out.append(f"BEGIN; SELECT sharded_nextval('s') FROM generate_series(1, {draws}); {end};")
print("\n".join(out))
PY
}

run_phase() { run_sessions stress "$1" $SESSIONS script "$2" "$3"; }
wait_phase() { wait_sessions; }
wait_ready() {
    for _ in $(seq 1 120); do
        psql -qX -d stress -c "SELECT 1" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "server did not come back"; return 1
}

echo "phase 1: rolled-back draws, then an immediate shutdown mid-load"
# native sequence drawn in rolled-back transactions, as its documentation warns
( for _ in $(seq 1 200000); do echo "BEGIN; SELECT nextval('native_s'); ROLLBACK;"; done ) \
    | psql -X -q -A -t -d stress >"$WORK/native.out" 2>/dev/null &
NATIVE=$!
run_phase p1 100 60000
sleep 2
cluster_stop immediate
wait_phase; wait $NATIVE || true
sessions_cut_off p1 $SESSIONS
cluster_start
wait_ready
( for _ in $(seq 1 200); do echo "SELECT nextval('native_s');"; done ) \
    | psql -X -q -A -t -d stress >>"$WORK/native.out" 2>/dev/null
python3 - "$WORK/native.out" <<'PY'
import sys, collections
c = collections.Counter(l.strip() for l in open(sys.argv[1]) if l.strip())
print(f"RESULT native nextval (comparison only): {sum(1 for n in c.values() if n > 1)} values handed out twice after the crash")
PY

echo "phase 2: mixed commits and rollbacks, a backend killed with SIGKILL mid-load"
run_phase p2 40 60000
sleep 2
victim="$(psql -qXAt -d stress -c "SELECT pid FROM pg_stat_activity WHERE datname = 'stress' AND pid <> pg_backend_pid() LIMIT 1")"
[ -n "$victim" ] && kill -9 "$victim"
wait_phase
sessions_cut_off p2 $SESSIONS
wait_ready

echo "phase 3: mixed load while the layout changes online"
run_phase p3 40 30000
sleep 0.5
psql -qX -d stress -c "SELECT sharded_seq.alter_sequence('s', shards => 6, block => 13)" >/dev/null
sleep 0.5
psql -qX -d stress -c "SELECT sharded_seq.advance_sequence('s', 50000000)" >/dev/null
sleep 0.5
psql -qX -d stress -c "SELECT sharded_seq.alter_sequence('s', shards => 2, block => 100)" >/dev/null
wait_phase
for f in "$WORK"/p3.*.err; do
    if [ -s "$f" ]; then echo "a session got an error in phase 3:"; cat "$f"; exit 1; fi
done
above=$(cat "$WORK"/p3.*.out | awk '$1 > 50000000 {n++} END {print n+0}')
echo "RESULT phase 3: $above values drawn after the online advance"
[ "$above" -gt 0 ] || { echo "the layout changes came after the load ended: test is void"; exit 1; }
psql -qX -d stress -c "SELECT name, shards, block, generation, reserved_high_water FROM sharded_seq.sequences"

python3 "$HERE/check_values.py" "$WORK"/p*.out

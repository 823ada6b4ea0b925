#!/usr/bin/env bash
# C1 under load: 16 sessions make committed and rolled-back increments,
# positive and negative, with an immediate shutdown in the middle and online
# shard changes after the restart.  Each committed increment also writes its
# delta to a ledger in the same transaction, so the counter's final total must
# equal the ledger's sum exactly, whatever the crash cut off.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
SESSIONS=16
WORK="$(mktemp -d /tmp/ss_ctr_crash.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
cluster_create "$WORK/pg"
cluster_start
db_create stress
psql -qX -d stress <<'SQL'
SELECT sharded_seq.create_counter('hits', shards => 8);
CREATE TABLE ledger (counter text, delta bigint);
SQL

script() {  # script TRANSACTIONS PHASE SESSION
    python3 - "$@" <<'PY'
import random, sys
n, phase, session = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
rnd = random.Random(hash((phase, session)))
out = []
for i in range(n):
    stmts = []
    for _ in range(rnd.choice([1, 1, 2, 3])):
        d = rnd.randint(-5, 10)
        name = rnd.choice(["hits", "hits", "hits", "other"])
        stmts.append(f"SELECT counter_incr('{name}', {d}); INSERT INTO ledger VALUES ('{name}', {d});")
    end = "ROLLBACK" if rnd.randrange(100) < 30 else "COMMIT"
    out.append("BEGIN; " + " ".join(stmts) + f" {end};")
print("\n".join(out))
PY
}
run_phase() { run_sessions stress "$1" $SESSIONS script "$2"; }
wait_phase() { wait_sessions; }

echo "phase 1: increments, then an immediate shutdown mid-load"
run_phase p1 50000
sleep 3
cluster_stop immediate
wait_phase
sessions_cut_off p1 $SESSIONS
cluster_start

echo "phase 2: increments while the shard count changes online"
run_phase p2 3000
sleep 1
psql -qX -d stress -c "SELECT sharded_seq.alter_counter('hits', shards => 3)" >/dev/null
sleep 0.5
psql -qX -d stress -c "SELECT sharded_seq.alter_counter('hits', shards => 16)" >/dev/null
sleep 0.5
psql -qX -d stress -c "SELECT sharded_seq.alter_counter('other', shards => 1)" >/dev/null
wait_phase
# Transactions touch 'hits' and 'other' in random orders, and 'other' ends
# with a single shard; commits take counters in a fixed order, so no session
# may see a deadlock or any other error.
if grep -v -h "^$" "$WORK"/p2.*.err | grep -q .; then
    echo "unexpected errors in phase 2:"; cat "$WORK"/p2.*.err | sort | uniq -c | head; exit 1
fi

psql -qX -d stress -At -F ' ' <<'SQL' >"$WORK/check.txt"
SELECT c.name, counter_value(c.name), (SELECT coalesce(sum(delta), 0) FROM ledger l WHERE l.counter = c.name),
       (SELECT count(*) FROM ledger l WHERE l.counter = c.name)
  FROM sharded_seq.counters c ORDER BY 1;
SQL
cat "$WORK/check.txt" | while read -r name total expected rows; do
    echo "RESULT counter $name: total=$total ledger=$expected committed increments=$rows"
done
awk '$2 != $3 {bad=1} END {exit bad}' "$WORK/check.txt" || { echo "a total differs from the sum of committed deltas"; exit 1; }
awk '$4 < 1000 {few=1} END {exit few}' "$WORK/check.txt" || { echo "too few increments committed: test is void"; exit 1; }

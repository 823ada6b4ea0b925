#!/usr/bin/env bash
# The memcached fast path under faults.  8 sessions draw from a memcached-tier
# sequence and increment a memcached counter (writing each committed delta to a
# ledger in the same transaction) while memcached gets flush_all, is killed
# with SIGKILL and restarted, and is finally taken down for good.  Then:
# no value repeats, each session's values increase, no session saw an error,
# and no counter total exceeds the true sum.  A second load with memcached up
# throughout checks that a memcached total is exact after a clean flush.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
SESSIONS=8
WORK="$(mktemp -d /tmp/ss_mc.XXXXXX)"
chmod 755 "$WORK"
trap 'memcached_kill KILL; cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
MC_PORT="$(free_port)"
memcached_start "$MC_PORT"
cluster_create "$WORK/pg"
echo "shared_preload_libraries = 'sharded_seq'" >>"$PGDATA/postgresql.conf"
echo "sharded_seq.memcached_servers = '127.0.0.1:$MC_PORT'" >>"$PGDATA/postgresql.conf"
echo "sharded_seq.counter_flush_interval = 1" >>"$PGDATA/postgresql.conf"
cluster_start
db_create stress
psql -qX -d stress <<'SQL' >/dev/null
SELECT sharded_seq.create_sequence('ms', tier => 'memcached', block => 500);
SELECT sharded_seq.create_counter('bc', shards => 4, mode => 'memcached');
CREATE TABLE ledger (counter text, delta bigint);
SQL

script() {  # script TRANSACTIONS COUNTER PHASE SESSION
    python3 - "$@" <<'PY'
import random, sys
n, counter, phase, session = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
rnd = random.Random(hash((phase, session)))
out = []
for i in range(n):
    if rnd.random() < 0.5:
        end = "ROLLBACK" if rnd.random() < 0.3 else "COMMIT"
        out.append(f"BEGIN; SELECT sharded_nextval('ms') FROM generate_series(1, {rnd.choice([1, 1, 3])}); {end};")
    else:
        d = rnd.randint(1, 9)
        end = "ROLLBACK" if rnd.random() < 0.3 else "COMMIT"
        out.append(f"BEGIN; SELECT counter_incr('{counter}', {d}) \\g /dev/null\nINSERT INTO ledger VALUES ('{counter}', {d}); {end};")
print("\n".join(out))
PY
}
run_phase() { run_sessions stress "$1" $SESSIONS script "$2" "$3"; }  # NAME TRANSACTIONS COUNTER
wait_phase() { wait_sessions; }
running() { sessions_running; }

echo "phase 1: load while memcached is flushed, killed, restarted and taken down"
run_phase p1 12000 bc
sleep 1.5
echo "  flush_all: $(memcached_cmd "$MC_PORT" flush_all)"
sleep 1.5
memcached_kill KILL
echo "  memcached killed"
sleep 1
memcached_start "$MC_PORT"
echo "  memcached restarted, empty"
sleep 1.5
psql -qXAt -d stress -c "SELECT server || ':' || port || ' healthy=' || healthy FROM sharded_seq.memcached_servers()" | sed 's/^/  /'
memcached_kill TERM
echo "  memcached taken down"
running || { echo "the load ended before memcached went down: test is void"; exit 1; }
down_health=$(psql -qXAt -d stress -c "SELECT bool_or(healthy) FROM sharded_seq.memcached_servers()")
echo "RESULT memcached down: any server healthy = $down_health"
[ "$down_health" = f ]
wait_phase

if cat "$WORK"/p1.*.err | grep -q .; then
    echo "a session saw an error:"; cat "$WORK"/p1.*.err | sort | uniq -c | head; exit 1
fi
echo "RESULT no session saw an error"
python3 "$HERE/check_values.py" "$WORK"/p1.*.out

# memcached back (empty); what it lost is gone, but nothing may count twice
memcached_start "$MC_PORT"
psql -qXAt -d stress -c "SELECT sharded_seq.flush_counters()" >/dev/null
read -r total ledger <<<"$(psql -qXAt -F ' ' -d stress -c "SELECT counter_value('bc'), (SELECT sum(delta) FROM ledger WHERE counter = 'bc')")"
echo "RESULT after the faults: memcached total $total, true sum $ledger (lost $((ledger - total)))"
[ "$total" -le "$ledger" ] || { echo "a total exceeds the true sum"; exit 1; }
[ "$total" -gt 0 ]

echo "phase 2: load with memcached up throughout, then a clean flush"
psql -qX -d stress -c "SELECT sharded_seq.create_counter('bc2', shards => 4, mode => 'memcached')" >/dev/null
# more than memcached can add in one step: it takes the exact path
psql -qX -d stress -c "BEGIN" -c "SELECT counter_incr('bc2', 5000000000)" -c "INSERT INTO ledger VALUES ('bc2', 5000000000)" -c "COMMIT" >/dev/null
run_phase p2 3000 bc2
sleep 0.5
psql -qX -d stress -c "SELECT sharded_seq.alter_sequence('ms', tier => 'database')" >/dev/null
sleep 0.5
psql -qX -d stress -c "SELECT sharded_seq.alter_sequence('ms', tier => 'memcached', block => 300)" >/dev/null
running || { echo "the load ended before the tier switches: test is void"; exit 1; }
wait_phase
echo "RESULT tier switched database -> memcached online: $(psql -qXAt -d stress -c "SELECT tier || ' block ' || block || ' generation ' || generation FROM sharded_seq.sequences WHERE name = 'ms'")"
if cat "$WORK"/p2.*.err | grep -q .; then cat "$WORK"/p2.*.err | head; exit 1; fi
flushed=$(psql -qXAt -d stress -c "SELECT sharded_seq.flush_counters()")
read -r total ledger pending <<<"$(psql -qXAt -F ' ' -d stress -c "SELECT counter_value('bc2'), (SELECT sum(delta) FROM ledger WHERE counter = 'bc2'), (SELECT pending FROM sharded_seq.counters WHERE name = 'bc2')")"
echo "RESULT after a clean flush ($flushed flushed): memcached total $total, true sum $ledger, pending $pending"
[ "$total" = "$ledger" ] && [ "$pending" = 0 ]
python3 "$HERE/check_values.py" "$WORK"/p1.*.out "$WORK"/p2.*.out
psql -qX -d stress -c "TABLE sharded_seq.memcached_stats"
psql -qXAt -d stress -c "SELECT 'RESULT stats: ' || string_agg(kind || ' ' || name || ' hits=' || hits || ' rebuilds=' || rebuilds || ' fallbacks=' || fallbacks || ' errors=' || errors || ' flushes=' || flushes, '; ') FROM sharded_seq.memcached_stats"
[ "$(psql -qXAt -d stress -c "SELECT rebuilds > 0 AND fallbacks > 0 AND hits > 0 FROM sharded_seq.memcached_stats WHERE name = 'ms'")" = t ]

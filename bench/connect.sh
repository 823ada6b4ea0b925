#!/usr/bin/env bash
# bench/connect.sh [SECONDS] [ROUNDS] [CONNECTIONS]: short connections
# (P10, P11 of docs/performance.md), side by side in one run, on a throwaway preloaded
# cluster:
#   - pgbench -C c=8 (a new connection per transaction): SELECT 1,
#     sharded_nextval through the node cache (cache 'node', the default),
#     sharded_nextval with a block per session (cache 'session', as before
#     1.5), native nextval CACHE 1000; ratios to SELECT 1 and to nextval;
#     and the server's CPU per connection (what the postmaster's exited
#     children used, from /proc: a measure a busy machine barely moves);
#   - the first call in a new session, timed by psql (\timing), median of
#     100 connections each, for the same three;
#   - values burned: CONNECTIONS connections (default 10,000, pgbench -C)
#     that draw one value each: the spread of the values drawn (max - min +
#     1) against their number, with each cache;
#   - long sessions, the node cache against a block per session: P1
#     (count(sharded_nextval) over 2,000,000 rows against nextval CACHE
#     block, best of ROUNDS + 2, the three taking turns) and P2 (pgbench -M
#     prepared c=16 against SELECT 1, 2 x ROUNDS rounds in alternating order).
# Workloads are interleaved over ROUNDS rounds; ratios are medians of
# per-round ratios.  Benchmarks are not tests: nothing here asserts a timing.
set -euo pipefail
cd "$(dirname "$0")/.."
T="${1:-5}"
ROUNDS="${2:-3}"
N="${3:-10000}"
[ -n "${SKIP_SETUP:-}" ] || scripts/setup.sh >/dev/null
source bench/lib.sh
bench_cluster "$(mktemp -d /tmp/ss_bench.XXXXXX)"
q() { psql -qXAt -d bench -c "$@"; }
q "ALTER SYSTEM SET shared_preload_libraries = 'sharded_seq'" >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$CLUSTER_DIR/server.log" -m fast -w restart >/dev/null
BLOCK="$(psql -qXAt -d bench -c "LOAD 'sharded_seq'" -c "SHOW sharded_seq.default_block")"
psql -qX -d bench >/dev/null <<SQL
CREATE SEQUENCE n_block CACHE $BLOCK;
SELECT sharded_seq.create_sequence('s_node');
SELECT sharded_seq.create_sequence('s_session', cache => 'session');
SELECT sharded_seq.create_sequence('b_node');
SELECT sharded_seq.create_sequence('b_session', cache => 'session');
SELECT sharded_seq.create_sequence('p1_node');
SELECT sharded_seq.create_sequence('p1_session', cache => 'session');
CREATE TABLE drawn (seq text, v bigint);
SQL

declare -A W RUNS CPU
# CPU (ms) the postmaster's exited children used so far: backends are reaped
# by the postmaster, so their time adds to its cutime and cstime
PM_PID="$(head -n 1 "$PGDATA/postmaster.pid")"
TICK="$(getconf CLK_TCK)"
children_cpu_ms() { awk -v t="$TICK" '{printf "%.0f", ($16 + $17) * 1000 / t}' "/proc/$PM_PID/stat"; }
W[select1]="SELECT 1;"
W[sharded_node]="SELECT sharded_nextval('s_node');"
W[sharded_session]="SELECT sharded_nextval('s_session');"
W[nextval]="SELECT nextval('n_block');"
ORDER="select1 sharded_node sharded_session nextval"
for w in $ORDER; do printf '%s\n' "${W[$w]}" >"$WORK/$w.sql"; done

for r in $(seq 1 "$ROUNDS"); do
    for w in $ORDER; do
        q "CHECKPOINT" >/dev/null
        c0=$(children_cpu_ms)
        pgbench -n -C -j 2 -c 8 -T "$T" -f "$WORK/$w.sql" bench >"$WORK/point.out" 2>/dev/null || true
        c1=$(children_cpu_ms)
        tps=$(awk '/^tps = / {printf "%.1f", $3}' "$WORK/point.out")
        n=$(awk '/^number of transactions actually processed:/ {print $NF}' "$WORK/point.out")
        # the CHECKPOINT's own backend exits within the window too: negligible
        cpu=$(awk -v a="$c0" -v b="$c1" -v n="${n:-0}" 'BEGIN {printf "%.3f", (n > 0) ? (b - a) / n : 0}')
        RUNS[$w]="${RUNS[$w]:-} ${tps:-0}"
        CPU[$w]="${CPU[$w]:-} $cpu"
        printf 'round %s %-16s -C c=8 %8s tps, server CPU %s ms per connection\n' "$r" "$w" "${tps:-0}" "$cpu" >&2
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
# ratio A B: the median over rounds of A's tps / B's tps in the same round
ratio() {
    local -a a=(${RUNS[$1]}) b=(${RUNS[$2]})
    for i in "${!a[@]}"; do awk -v x="${a[$i]}" -v y="${b[$i]}" 'BEGIN {printf "%.3f ", (y > 0) ? x / y : 0}'; done | median
}

# the first call in a new session, in ms (psql's \timing), median of 100
first_call() {
    for _ in $(seq 1 100); do
        psql -qXAt -d bench -c '\timing on' -c "$1" 2>&1 | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p'
    done | tr '\n' ' ' | median
}
fc_node=$(first_call "SELECT sharded_nextval('s_node')")
fc_session=$(first_call "SELECT sharded_nextval('s_session')")
fc_native=$(first_call "SELECT nextval('n_block')")
fc_select=$(first_call "SELECT 1")

# values burned by N one-value connections, each cache
printf "INSERT INTO drawn VALUES ('b_node', sharded_nextval('b_node'));\n" >"$WORK/b_node.sql"
printf "INSERT INTO drawn VALUES ('b_session', sharded_nextval('b_session'));\n" >"$WORK/b_session.sql"
for b in b_node b_session; do
    pgbench -n -C -j 2 -c 8 -t $((N / 8)) -f "$WORK/$b.sql" bench >/dev/null 2>&1
done
spread() { q "SELECT count(*) || ' values spread over ' || (max(v) - min(v) + 1) FROM drawn WHERE seq = '$1'"; }

# long sessions: P1 inside one statement, P2 at c=16.  This machine's
# throughput drifts by tens of percent within minutes, so the three P1
# statements take turns (best of ROUNDS + 2 each), and P2 runs 2 x ROUNDS
# rounds, every other one in the reverse order: drift falls on both sides of
# each ratio alike.
ms() { psql -qX -d bench -c '\timing on' -c "$1" 2>&1 | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p'; }
best() { tr ' ' '\n' | grep -v '^$' | sort -g | head -n 1; }
declare -A P1
for r in $(seq 1 $((ROUNDS + 2))); do
    P1[native]="${P1[native]:-} $(ms "SELECT count(nextval('n_block')) FROM generate_series(1, 2000000)")"
    P1[node]="${P1[node]:-} $(ms "SELECT count(sharded_nextval('p1_node')) FROM generate_series(1, 2000000)")"
    P1[session]="${P1[session]:-} $(ms "SELECT count(sharded_nextval('p1_session')) FROM generate_series(1, 2000000)")"
done
p1_native=$(echo "${P1[native]}" | best)
p1_node=$(echo "${P1[node]}" | best)
p1_session=$(echo "${P1[session]}" | best)
declare -A L
for r in $(seq 1 $((2 * ROUNDS))); do
    order="select1 sharded_node sharded_session"
    [ $((r % 2)) = 0 ] && order="sharded_session sharded_node select1"
    for w in $order; do
        tps=$(pgbench -n -M prepared -j 2 -c 16 -T "$T" -f "$WORK/$w.sql" bench 2>/dev/null \
              | awk '/^tps = / {printf "%.1f", $3}')
        L[$w]="${L[$w]:-} ${tps:-0}"
        printf 'round %s %-16s c=16 %8s tps\n' "$r" "$w" "${tps:-0}" >&2
    done
done
lratio() {
    local -a a=(${L[$1]}) b=(${L[$2]})
    for i in "${!a[@]}"; do awk -v x="${a[$i]}" -v y="${b[$i]}" 'BEGIN {printf "%.3f ", (y > 0) ? x / y : 0}'; done | median
}

echo "short connections, pgbench -C c=8, ${T}s x $ROUNDS rounds (median tps; ratios: median of per-round ratios)"
for w in $ORDER; do printf '  %-16s %10s tps   (%s)\n' "$w" "$(echo "${RUNS[$w]}" | median)" "${RUNS[$w]# }"; done
echo "server CPU per connection (median, ms): $(for w in $ORDER; do printf '%s %s; ' "$w" "$(echo "${CPU[$w]}" | median)"; done | sed 's/; $//')"
echo "P10 sharded_nextval (node) / SELECT 1, -C:          $(ratio sharded_node select1)   (bar >= 0.95)"
echo "P10 sharded_nextval (node) / nextval CACHE $BLOCK, -C: $(ratio sharded_node nextval)   (bar >= 1.0)"
echo "    sharded_nextval (session) / SELECT 1, -C:       $(ratio sharded_session select1)   (before 1.5)"
echo "    nextval CACHE $BLOCK / SELECT 1, -C:               $(ratio nextval select1)"
echo "first call in a new session (median of 100, ms): sharded_nextval node $fc_node, session $fc_session; nextval $fc_native; SELECT 1 $fc_select"
echo "P11 $N one-value connections, block $BLOCK: node cache $(spread b_node) (bar <= 2 blocks + $N = $((2 * BLOCK + N))); per session $(spread b_session)"
echo "long sessions: P1 count over 2,000,000 rows (best of $((ROUNDS + 2)), taking turns): nextval CACHE $BLOCK ${p1_native} ms, node cache ${p1_node} ms ($(awk -v a="$p1_node" -v b="$p1_native" 'BEGIN {printf "%.2f", a / b}')), per session ${p1_session} ms ($(awk -v a="$p1_session" -v b="$p1_native" 'BEGIN {printf "%.2f", a / b}'))   (bar <= 1.0)"
echo "long sessions: P2 pgbench -M prepared c=16, $((2 * ROUNDS)) rounds / SELECT 1 ($(echo "${L[select1]}" | median) tps): node cache $(lratio sharded_node select1), per session $(lratio sharded_session select1)   (bar >= 0.95)"
q "SELECT name, cache_in_force, node_cache_hits, node_cache_reservations, node_cache_waits FROM sharded_seq.sequences ORDER BY name" | sed 's/^/  view: /'

#!/usr/bin/env bash
# bench/block_size.sh [SECONDS]: how block and shard counts trade throughput
# against gaps.  For each layout: pgbench c=16 SELECT sharded_nextval(), and
# the values left unused when 100 short sessions draw one value each.
set -euo pipefail
cd "$(dirname "$0")/.."
T="${1:-5}"
scripts/setup.sh >/dev/null
source scripts/lib.sh
bench_cluster "$(mktemp -d /tmp/ss_bench.XXXXXX)"
echo "SELECT 1;" >"$WORK/select1.sql"
s1=$(pgbench -n -M prepared -j 2 -c 16 -T "$T" -f "$WORK/select1.sql" bench 2>/dev/null | awk '/^tps = / {printf "%d", $3}')
echo "| shards | block | c=16 tps | vs SELECT 1 ($s1) | spread of 100 one-value sessions |"
echo "|---:|---:|---:|---:|---:|"
for layout in "1 1" "1 10" "4 10" "4 100" "1 1000" "4 1000" "16 1000" "4 10000"; do
    set -- $layout
    name="s_${1}_${2}"
    psql -qX -d bench -c "SELECT sharded_seq.create_sequence('$name', shards => $1, block => $2)" >/dev/null
    echo "SELECT sharded_nextval('$name');" >"$WORK/$name.sql"
    tps=$(pgbench -n -M prepared -j 2 -c 16 -T "$T" -f "$WORK/$name.sql" bench 2>/dev/null | awk '/^tps = / {printf "%d", $3}')
    # 100 sessions that each draw a single value and disconnect
    for _ in $(seq 1 100); do psql -qXAt -d bench -c "SELECT sharded_nextval('$name')"; done >"$WORK/$name.vals"
    spread=$(sort -n "$WORK/$name.vals" | awk 'NR == 1 {lo = $1} {hi = $1} END {print hi - lo + 1}')
    ratio=$(python3 -c "print(f'{$tps / $s1:.2f}')")
    echo "| $1 | $2 | $tps | $ratio | $spread |"
done

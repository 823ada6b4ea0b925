#!/usr/bin/env bash
# bench/block_size.sh [SECONDS]: throughput of pgbench c=16
# SELECT sharded_nextval() for several layouts, against SELECT 1.  Each ended
# session leaves at most block - 1 values of its block unused.
set -euo pipefail
cd "$(dirname "$0")/.."
T="${1:-5}"
scripts/setup.sh >/dev/null
source bench/lib.sh
bench_cluster "$(mktemp -d /tmp/ss_bench.XXXXXX)"
echo "SELECT 1;" >"$WORK/select1.sql"
s1=$(pgbench -n -M prepared -j 2 -c 16 -T "$T" -f "$WORK/select1.sql" bench 2>/dev/null | awk '/^tps = / {printf "%d", $3}')
echo "| shards | block | c=16 tps | vs SELECT 1 ($s1 tps) |"
echo "|---:|---:|---:|---:|"
for layout in "1 1" "1 10" "4 10" "4 100" "1 1000" "4 1000" "16 1000" "4 10000"; do
    set -- $layout
    name="s_${1}_${2}"
    psql -qX -d bench -c "SELECT sharded_seq.create_sequence('$name', shards => $1, block => $2)" >/dev/null
    echo "SELECT sharded_nextval('$name');" >"$WORK/$name.sql"
    psql -qX -d bench -c "CHECKPOINT" >/dev/null
    tps=$(pgbench -n -M prepared -j 2 -c 16 -T "$T" -f "$WORK/$name.sql" bench 2>/dev/null | awk '/^tps = / {printf "%d", $3}')
    ratio=$(python3 -c "print(f'{$tps / $s1:.2f}')")
    echo "| $1 | $2 | $tps | $ratio |"
done

#!/usr/bin/env bash
# bench/counter_size.sh [INCREMENTS]: how large the counter shard table grows
# under sustained increments (1,000,000 from 16 sessions by default), with
# autovacuum at its defaults.  Prints sizes and the share of HOT updates.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-1000000}"
scripts/setup.sh >/dev/null
source bench/lib.sh
bench_cluster "$(mktemp -d /tmp/ss_bench.XXXXXX)"
psql -qX -d bench -c "SELECT sharded_seq.create_counter('c', shards => 16)" >/dev/null
echo "SELECT counter_incr('c');" >"$WORK/incr.sql"
size() {
    psql -qXAt -d bench -c "SELECT pg_size_pretty(pg_relation_size('sharded_seq.counter_shards')) || ' heap, ' ||
        pg_size_pretty(pg_relation_size('sharded_seq.counter_shards_pkey')) || ' index'"
}
echo "before: $(size)"
start=$(date +%s)
pgbench -n -M prepared -j 2 -c 16 -t $((N / 16)) -f "$WORK/incr.sql" bench 2>/dev/null | grep -E "^tps"
echo "$N increments from 16 sessions in $(( $(date +%s) - start ))s"
psql -qXAt -d bench -c "SELECT pg_stat_force_next_flush()" >/dev/null
sleep 1
echo "after:  $(size); total = $(psql -qXAt -d bench -c "SELECT counter_value('c')")"
psql -qXAt -d bench -c "SELECT 'updates: ' || n_tup_upd || ', HOT: ' || n_tup_hot_upd || ' (' || round(100.0 * n_tup_hot_upd / greatest(n_tup_upd, 1), 1) || '%), dead now: ' || n_dead_tup || ', autovacuums: ' || autovacuum_count
    FROM pg_stat_user_tables WHERE relname = 'counter_shards'"

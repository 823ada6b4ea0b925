#!/usr/bin/env bash
# bench/cold.sh [SECONDS] [ROUNDS] [COUNTERS]: counters at application scale
# (P7, P4, P6 of docs/performance.md), side by side with their anchors in one run.
#
#   - bytes: COUNTERS counters created by counter_incr (growth of every table
#     in schema sharded_seq, indexes included) against a plain
#     (name text PRIMARY KEY, n bigint) table holding the same names;
#   - random increments and reads over them against plain UPDATE and SELECT;
#   - one hot counter created by counter_incr, with no administrative call,
#     against one hot row, and how many seconds it takes to get there;
#   - counter_value on a 16-shard counter right after an increment storm,
#     before and after sharded_seq.maintain(), against SELECT 1.
# Workloads are interleaved over ROUNDS rounds; ratios are medians of
# per-round ratios.  Benchmarks are not tests: nothing here asserts a timing.
set -euo pipefail
cd "$(dirname "$0")/.."
T="${1:-5}"
ROUNDS="${2:-3}"
N="${3:-20000}"
[ -n "${SKIP_SETUP:-}" ] || scripts/setup.sh >/dev/null
source bench/lib.sh
bench_cluster "$(mktemp -d /tmp/ss_bench.XXXXXX)"
q() { psql -qXAt -d bench -c "$@"; }
# preloaded, as a production server runs it: kept totals need shared memory
q "ALTER SYSTEM SET shared_preload_libraries = 'sharded_seq'" >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$CLUSTER_DIR/server.log" -m fast -w restart >/dev/null

ours_bytes() {
    q "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c
        WHERE c.relnamespace = 'sharded_seq'::regnamespace AND c.relkind = 'r'"
}
before=$(ours_bytes)
q "SELECT count(counter_incr('page.' || g || '.views')) FROM generate_series(1, $N) g" >/dev/null
q "VACUUM ANALYZE" >/dev/null
ours=$(( $(ours_bytes) - before ))
q "CREATE TABLE plain (name text PRIMARY KEY, n bigint NOT NULL DEFAULT 0)" >/dev/null
q "INSERT INTO plain SELECT 'page.' || g || '.views', 1 FROM generate_series(1, $N) g" >/dev/null
q "VACUUM ANALYZE plain" >/dev/null
plain=$(q "SELECT pg_total_relation_size('plain')")
tables=$(q "SELECT string_agg(c.relname || ' ' || pg_size_pretty(pg_total_relation_size(c.oid)), ', ' ORDER BY c.relname)
             FROM pg_class c WHERE c.relnamespace = 'sharded_seq'::regnamespace AND c.relkind = 'r'")

psql -qX -d bench >/dev/null <<SQL
CREATE TABLE hot (id int PRIMARY KEY, n bigint) WITH (fillfactor = 50);
INSERT INTO hot VALUES (1, 0);
SELECT sharded_seq.create_counter('c16', shards => 16);
SQL

declare -A W RUNS
W[select1]="SELECT 1;"
W[plain_update]=$'\\set i random(1, '"$N"$')\nUPDATE plain SET n = n + 1 WHERE name = \'page.\' || :i || \'.views\';'
W[counter_incr_cold]=$'\\set i random(1, '"$N"$')\nSELECT counter_incr(\'page.\' || :i || \'.views\');'
W[plain_select]=$'\\set i random(1, '"$N"$')\nSELECT n FROM plain WHERE name = \'page.\' || :i || \'.views\';'
W[counter_value_cold]=$'\\set i random(1, '"$N"$')\nSELECT counter_value(\'page.\' || :i || \'.views\');'
W[update_hot_row]="UPDATE hot SET n = n + 1 WHERE id = 1;"
W[counter_incr_hot]="SELECT counter_incr('hot');"
W[storm]="SELECT counter_incr('c16');"
W[value_after_storm]="SELECT counter_value('c16');"
W[value_after_maintain]="SELECT counter_value('c16');"
ORDER="select1 plain_update counter_incr_cold plain_select counter_value_cold update_hot_row counter_incr_hot storm value_after_storm value_after_maintain"
for w in $ORDER; do printf '%s\n' "${W[$w]}" >"$WORK/$w.sql"; done

# The hot counter is created by its first increment, under load: tps for
# each second of the first ten.
warmup=$(pgbench -n -M prepared -j 2 -c 16 -T 10 -P 1 -f "$WORK/counter_incr_hot.sql" bench 2>&1 \
         | awk '/^progress:/ {printf "%s%d", sep, $4; sep=" "}')
rows_hot=$(q "SELECT shards FROM sharded_seq.counters WHERE name = 'hot'")

for r in $(seq 1 "$ROUNDS"); do
    for w in $ORDER; do
        case $w in
            value_after_storm) ;;  # straight after the storm: no VACUUM, no CHECKPOINT
            value_after_maintain) q "SELECT * FROM sharded_seq.maintain()" >/dev/null ;;
            *) psql -qX -d bench -c "VACUUM" -c "CHECKPOINT" >/dev/null ;;
        esac
        tps=$(pgbench -n -M prepared -j 2 -c 16 -T "$T" -f "$WORK/$w.sql" bench 2>/dev/null \
              | awk '/^tps = / {printf "%d", $3}')
        RUNS[$w]="${RUNS[$w]:-} ${tps:-0}"
        printf 'round %s %-22s c=16 %8s tps\n' "$r" "$w" "${tps:-0}" >&2
    done
done
pages_c16=$(q "SELECT count(DISTINCT (s.ctid::text::point)[0]) FROM sharded_seq.counter_shards s
               JOIN sharded_seq.counter_config c ON c.id = s.counter_id WHERE c.name = 'c16'")

echo
echo "pgbench -n -M prepared -j 2 -c 16 -T $T, median of $ROUNDS interleaved rounds, PostgreSQL $(q 'SHOW server_version'), $(nproc) cores, $N counters"
echo
echo "| workload | c=16 tps |"
echo "|---|---:|"
for w in $ORDER; do echo "| \`${W[$w]//$'\n'/ }\` ($w) | $(median ${RUNS[$w]}) |"; done
echo
echo "| | measured | bar |"
echo "|---|---:|---|"
echo "| P7 bytes: $N counters / plain table | $(python3 -c "print(f'{$ours/$plain:.2f}')") ($((ours / 1024)) kB / $((plain / 1024)) kB) | ≤ 3 (aim 2) |"
echo "| P7 random counter_incr / plain UPDATE | $(pratio counter_incr_cold plain_update) | ≥ 0.95 |"
echo "| P7 random counter_value / plain SELECT | $(pratio counter_value_cold plain_select) | ≥ 0.9 |"
echo "| P4 hot counter_incr (adaptive, made by counter_incr) / one hot row | $(pratio counter_incr_hot update_hot_row) | ≥ 4 |"
echo "| P6 counter_value (16 shards) right after a storm / SELECT 1 | $(pratio value_after_storm select1) | ≥ 0.8 |"
echo "| P6 the same after sharded_seq.maintain() / SELECT 1 | $(pratio value_after_maintain select1) | ≥ 0.8 |"
echo
echo "Hot counter, first ten seconds (tps per second): $warmup; rows now: $rows_hot"
echo "Tables in schema sharded_seq: $tables"
echo "16-shard counter's rows now lie on $pages_c16 page(s)"

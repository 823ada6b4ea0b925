#!/usr/bin/env bash
# bench/run.sh [SECONDS] [ROUNDS]: pgbench side by side with the anchors, in
# one run, on a throwaway cluster and memcached; prints the P1-P8 ratios of
# docs/performance.md.  Workloads are interleaved over ROUNDS rounds and each figure is
# the median, which keeps a noisy 2-core machine from deciding a ratio.
# Benchmarks are not tests: nothing here asserts a timing.
set -euo pipefail
cd "$(dirname "$0")/.."
T="${1:-5}"
ROUNDS="${2:-3}"
scripts/setup.sh >/dev/null
source bench/lib.sh
MC_PORT="$(free_port)"
memcached_start "$MC_PORT" >/dev/null
bench_cluster "$(mktemp -d /tmp/ss_bench.XXXXXX)"
trap 'memcached_kill; cluster_destroy >/dev/null 2>&1; rm -rf "$WORK"' EXIT
# preloaded, as mode 'buffered' and the background worker need
psql -qX -d bench -c "LOAD 'sharded_seq'" -c "ALTER SYSTEM SET sharded_seq.memcached_servers = '127.0.0.1:$MC_PORT'" \
     -c "ALTER SYSTEM SET shared_preload_libraries = 'sharded_seq'" >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$CLUSTER_DIR/server.log" -m fast -w restart >/dev/null
BLOCK="$(psql -qXAt -d bench -c "LOAD 'sharded_seq'" -c "SHOW sharded_seq.default_block")"
psql -qX -d bench >/dev/null <<SQL
CREATE SEQUENCE s_cache1 CACHE 1;
CREATE SEQUENCE s_cache100 CACHE 100;
CREATE SEQUENCE s_block CACHE $BLOCK;
SELECT sharded_seq.create_sequence('s');
SELECT sharded_seq.create_sequence('s_p1');
SELECT sharded_seq.create_sequence('s_insert');
CREATE TABLE t_identity (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v int);
CREATE TABLE t_sharded (id bigint PRIMARY KEY DEFAULT sharded_nextval('s_insert'), v int);
CREATE TABLE hot (id int PRIMARY KEY, n bigint) WITH (fillfactor = 50);
INSERT INTO hot VALUES (1, 0);
CREATE TABLE slots (id int PRIMARY KEY, n bigint) WITH (fillfactor = 50);
INSERT INTO slots SELECT g, 0 FROM generate_series(1, 16) g;
SELECT sharded_seq.create_counter('c', shards => 16);
SELECT counter_incr('c');
SELECT sharded_seq.create_sequence('s_mc', tier => 'memcached');
SELECT sharded_seq.create_counter('c_mc', mode => 'memcached');
SELECT sharded_seq.create_counter('c_buf', mode => 'buffered');
SQL

declare -A W
W[select1]="SELECT 1;"
W[nextval_cache1]="SELECT nextval('s_cache1');"
W[nextval_cache100]="SELECT nextval('s_cache100');"
W[sharded_nextval]="SELECT sharded_nextval('s');"
W[insert_identity]="INSERT INTO t_identity (v) VALUES (1);"
W[insert_sharded]="INSERT INTO t_sharded (v) VALUES (1);"
W[update_hot_row]="UPDATE hot SET n = n + 1 WHERE id = 1;"
W[update_16_slots]=$'\\set r random(1, 16)\nUPDATE slots SET n = n + 1 WHERE id = :r;'
W[counter_incr]="SELECT counter_incr('c');"
W[counter_value]="SELECT counter_value('c');"
W[sharded_nextval_mc]="SELECT sharded_nextval('s_mc');"
W[counter_incr_memcached]="SELECT counter_incr('c_mc');"
W[counter_incr_buffered]="SELECT counter_incr('c_buf');"
ORDER="select1 nextval_cache1 nextval_cache100 sharded_nextval insert_identity insert_sharded update_hot_row update_16_slots counter_incr counter_value sharded_nextval_mc counter_incr_memcached counter_incr_buffered"

declare -A RUNS TPS
for w in $ORDER; do printf '%s\n' "${W[$w]}" >"$WORK/$w.sql"; done
for r in $(seq 1 "$ROUNDS"); do
    for w in $ORDER; do
        for c in 1 16; do
            # every measurement starts from the same clean state
            psql -qX -d bench -c "VACUUM" -c "CHECKPOINT" >/dev/null
            tps=$(pgbench -n -M prepared -j 2 -c $c -T "$T" -f "$WORK/$w.sql" bench 2>/dev/null \
                  | awk '/^tps = / {printf "%d", $3}')
            RUNS[$w.$c]="${RUNS[$w.$c]:-} ${tps:-0}"
        done
        printf 'round %s %-18s c=1 %8s tps   c=16 %8s tps\n' "$r" "$w" \
            "${RUNS[$w.1]##* }" "${RUNS[$w.16]##* }" >&2
    done
done
for k in "${!RUNS[@]}"; do TPS[$k]=$(median ${RUNS[$k]}); done

# P1: inside one statement, best of three
best_ms() {
    local best=""
    for _ in 1 2 3; do
        ms=$(psql -qX -d bench -c '\timing on' -c "$1" 2>&1 | awk '/^Time:/ {print $2}')
        best=$(python3 -c "import sys; a=[float(x) for x in sys.argv[1:] if x]; print(min(a))" $ms $best)
    done
    echo "$best"
}
P1_COUNT=$(best_ms "SELECT count(g) FROM generate_series(1, 2000000) g")
P1_NATIVE=$(best_ms "SELECT count(nextval('s_block')) FROM generate_series(1, 2000000)")
P1_SHARDED=$(best_ms "SELECT count(sharded_nextval('s_p1')) FROM generate_series(1, 2000000)")

ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{a/b:.2f}' if b else 'n/a')" "$1" "$2"; }
echo
echo "pgbench -n -M prepared -j 2 -T $T, median tps of $ROUNDS interleaved rounds (ratios: median of per-round ratios), PostgreSQL $(psql -qXAt -d bench -c 'SHOW server_version'), $(nproc) cores; sharded_seq defaults: block $BLOCK, $(psql -qXAt -d bench -c "LOAD 'sharded_seq'" -c 'SHOW sharded_seq.default_sequence_shards') shards"
echo
echo "| workload | c=1 tps | c=16 tps |"
echo "|---|---:|---:|"
for w in $ORDER; do echo "| \`${W[$w]//$'\n'/ }\` | ${TPS[$w.1]} | ${TPS[$w.16]} |"; done
echo
echo "Inside one statement, 2,000,000 rows (best of 3): count(g) ${P1_COUNT} ms; count(nextval) CACHE $BLOCK ${P1_NATIVE} ms; count(sharded_nextval) ${P1_SHARDED} ms"
echo
echo "| id | comparison | ratio | bar |"
echo "|---|---|---:|---|"
echo "| P1 | count(sharded_nextval) / count(nextval CACHE $BLOCK), time | $(ratio "$P1_SHARDED" "$P1_NATIVE") | ≤ 1.0 |"
echo "| P2 | sharded_nextval / SELECT 1, c=16 | $(pratio sharded_nextval.16 select1.16) | ≥ 0.95 |"
echo "| P3 | INSERT DEFAULT sharded_nextval / identity, c=16 | $(pratio insert_sharded.16 insert_identity.16) | ≥ 0.95 |"
echo "| P4 | counter_incr (exact) / one hot row, c=16 | $(pratio counter_incr.16 update_hot_row.16) | ≥ 4 |"
echo "| P4 | counter_incr (exact) / 16 slot rows, c=16 | $(pratio counter_incr.16 update_16_slots.16) | ≥ 1.2 |"
echo "| P5 | counter_incr (memcached) / SELECT 1, c=16 | $(pratio counter_incr_memcached.16 select1.16) | ≥ 0.6 |"
echo "| P5 | sharded_nextval memcached tier / database tier, c=16 | $(pratio sharded_nextval_mc.16 sharded_nextval.16) | ≥ 0.9 |"
echo "| P6 | counter_value (16 shards) / SELECT 1, c=16 | $(pratio counter_value.16 select1.16) | ≥ 0.8 |"
echo "| P8 | counter_incr (buffered, shared memory) / SELECT 1, c=16 | $(pratio counter_incr_buffered.16 select1.16) | ≥ 0.8 |"

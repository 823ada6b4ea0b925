#!/usr/bin/env bash
# bench/citus.sh [SECONDS] [ROUNDS]: sharded_seq on a Citus cluster (a
# coordinator and two workers on loopback, PostgreSQL 15, Citus built by
# scripts/citus.sh) against Citus's own answers, in one run; prints ratios.
#  - inserts into a distributed table with DEFAULT sharded_nextval against a
#    bigserial column, through the coordinator, and spread over the workers
#    (clients write to both workers at once);
#  - counter_incr of one hot counter from every node at once against an
#    UPDATE of one hot row of a distributed table from every node;
#  - what counter_value costs over the cluster (each call reads the other
#    nodes), against counter_node_value (this node only) and SELECT 1.
# Workloads are interleaved over ROUNDS rounds; each figure is the median.
# Benchmarks are not tests: nothing here asserts a timing.
set -euo pipefail
cd "$(dirname "$0")/.."
T="${1:-5}"
ROUNDS="${2:-3}"
scripts/citus.sh
scripts/setup.sh >/dev/null
source bench/lib.sh
if [ ! -f "$(pg_config --pkglibdir)/citus.so" ]; then
    echo "bench/citus.sh: Citus is not installed (scripts/citus.sh builds it from ../shared/citus)" >&2
    exit 1
fi
WORK="$(mktemp -d /tmp/ss_citus_bench.XXXXXX)"
chmod 755 "$WORK"
declare -a PORTS DATAS
cleanup() {
    for d in "${DATAS[@]:-}"; do
        [ -n "$d" ] && as_pg "$PGBIN/pg_ctl" -D "$d" -m immediate -w stop >/dev/null 2>&1 || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
for i in 0 1 2; do
    cluster_create "$WORK/n$i"
    cat >>"$PGDATA/postgresql.conf" <<CONF
shared_preload_libraries = 'citus,sharded_seq'
max_prepared_transactions = 100
max_connections = 200
citus.local_hostname = '127.0.0.1'
CONF
    cluster_start
    PORTS[$i]=$PGPORT
    DATAS[$i]=$PGDATA
    psql -qX -p "$PGPORT" -d postgres -c "CREATE DATABASE bench" >/dev/null
    psql -qX -p "$PGPORT" -d bench -c "CREATE EXTENSION citus" >/dev/null
done
C=${PORTS[0]}
psql -qX -p "$C" -d bench >/dev/null <<SQL
SELECT citus_set_coordinator_host('127.0.0.1', $C);
SELECT citus_add_node('127.0.0.1', ${PORTS[1]});
SELECT citus_add_node('127.0.0.1', ${PORTS[2]});
CREATE EXTENSION sharded_seq;
SELECT sharded_seq.create_sequence('orders_id');
SELECT sharded_seq.create_counter('hot');
CREATE TABLE t_sharded (customer int, id bigint DEFAULT sharded_nextval('orders_id'), v int);
CREATE TABLE t_serial (customer int, id bigserial, v int);
CREATE TABLE hot_row (id int PRIMARY KEY, n bigint) WITH (fillfactor = 50);
SELECT create_distributed_table('t_sharded', 'customer');
SELECT create_distributed_table('t_serial', 'customer');
SELECT create_distributed_table('hot_row', 'id');
INSERT INTO hot_row VALUES (1, 0);
SELECT counter_incr('hot');
SQL
# every node has used the sequence and the counter once (definitions pulled)
for p in "${PORTS[@]}"; do
    psql -qX -p "$p" -d bench -c "SELECT sharded_nextval('orders_id'), counter_incr('hot')" >/dev/null
done

declare -A W
W[insert_sharded]=$'\\set c random(1, 100000)\nINSERT INTO t_sharded (customer, v) VALUES (:c, 1);'
W[insert_bigserial]=$'\\set c random(1, 100000)\nINSERT INTO t_serial (customer, v) VALUES (:c, 1);'
W[counter_incr]="SELECT counter_incr('hot');"
W[update_hot_row]="UPDATE hot_row SET n = n + 1 WHERE id = 1;"
W[counter_value]="SELECT counter_value('hot');"
W[counter_node_value]="SELECT sharded_seq.counter_node_value('hot');"
W[select1]="SELECT 1;"
for w in "${!W[@]}"; do printf '%s\n' "${W[$w]}" >"$WORK/$w.sql"; done

# run WORKLOAD CLIENTS PORT...: pgbench on each port at once; the summed tps
run() {
    local w="$1" c="$2"; shift 2
    local pids=() i=0
    for p in "$@"; do
        pgbench -n -M prepared -j 1 -c "$c" -T "$T" -p "$p" -f "$WORK/$w.sql" bench >"$WORK/out.$i" 2>/dev/null &
        pids+=($!); i=$((i + 1))
    done
    wait "${pids[@]}"
    cat "$WORK"/out.* | awk '/^tps = / {s += $3} END {printf "%d", s}'
    rm -f "$WORK"/out.*
}
declare -A RUNS
add() { RUNS[$1]="${RUNS[$1]:-} $2"; printf 'round %s %-34s %8s tps\n' "$r" "$1" "$2" >&2; }
for r in $(seq 1 "$ROUNDS"); do
    for w in insert_sharded insert_bigserial; do
        add "$w.coordinator" "$(run $w 16 "$C")"
        add "$w.workers" "$(run $w 8 "${PORTS[1]}" "${PORTS[2]}")"
    done
    for w in counter_incr update_hot_row; do
        add "$w.every_node" "$(run $w 6 "${PORTS[@]}")"
    done
    for w in counter_value counter_node_value select1; do
        add "$w.c1" "$(run $w 1 "$C")"
    done
done
echo
echo "Citus $(psql -qXAt -p "$C" -d bench -c "SELECT extversion FROM pg_extension WHERE extname = 'citus'"), PostgreSQL $(psql -qXAt -p "$C" -d bench -c 'SHOW server_version'), a coordinator and 2 workers on one machine of $(nproc) cores; pgbench -n -M prepared -T $T, median of $ROUNDS interleaved rounds (ratios: median of per-round ratios)"
echo
echo "| workload | where | tps |"
echo "|---|---|---:|"
for k in insert_sharded.coordinator insert_bigserial.coordinator insert_sharded.workers insert_bigserial.workers \
         counter_incr.every_node update_hot_row.every_node counter_value.c1 counter_node_value.c1 select1.c1; do
    w="${k%%.*}"
    echo "| \`${W[$w]//$'\n'/ }\` | ${k#*.} | $(median ${RUNS[$k]}) |"
done
echo
echo "| comparison | ratio |"
echo "|---|---:|"
echo "| INSERT DEFAULT sharded_nextval / bigserial, through the coordinator (c=16) | $(pratio insert_sharded.coordinator insert_bigserial.coordinator) |"
echo "| INSERT DEFAULT sharded_nextval / bigserial, on both workers at once (c=8 each) | $(pratio insert_sharded.workers insert_bigserial.workers) |"
echo "| counter_incr of one counter / UPDATE of one hot row of a distributed table, from every node (c=6 each) | $(pratio counter_incr.every_node update_hot_row.every_node) |"
echo "| counter_value over 3 nodes / counter_node_value, c=1 | $(pratio counter_value.c1 counter_node_value.c1) |"
echo "| counter_value over 3 nodes / SELECT 1, c=1 | $(pratio counter_value.c1 select1.c1) |"

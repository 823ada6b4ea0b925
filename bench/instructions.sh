#!/usr/bin/env bash
# bench/instructions.sh [DRAWS]: instructions per sharded_nextval, counted by
# valgrind (callgrind) rather than timed: a count does not move with the
# machine's load, so two builds compare even on a busy machine.  A throwaway
# preloaded cluster draws DRAWS (default 200,000) more values in one
# statement than a first run does, through the node cache and through a
# block per session, in single-user mode (postgres --single) under callgrind,
# collecting inside sharded_nextval only; the difference of the two counts,
# over DRAWS, is the marginal cost of a draw, reservations of new blocks
# included (one per 1,000 values).  Prints the count per draw and the
# functions that cost the most (CG_OUT=DIR keeps the callgrind files there,
# for callgrind_annotate --auto=yes); then the instructions of a whole
# transaction that executes a prepared SELECT 1, SELECT random() (a volatile
# built-in call), sharded_seq.node_id() (a C function of the module that does
# next to nothing: what the call of any module function costs, fmgr's
# catalog lookup included), sharded_nextval or nextval (P2's unit).
set -euo pipefail
cd "$(dirname "$0")/.."
DRAWS="${1:-200000}"
[ -n "${SKIP_SETUP:-}" ] || scripts/setup.sh >/dev/null
command -v valgrind >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null; }
source bench/lib.sh
bench_cluster "$(mktemp -d /tmp/ss_instr.XXXXXX)"
q() { psql -qXAt -d bench -c "$@"; }
q "ALTER SYSTEM SET shared_preload_libraries = 'sharded_seq'" >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$CLUSTER_DIR/server.log" -m fast -w restart >/dev/null
q "SELECT sharded_seq.create_sequence('i_node')" >/dev/null
q "SELECT sharded_seq.create_sequence('i_session', cache => 'session')" >/dev/null
q "CREATE SEQUENCE i_native CACHE 1000" >/dev/null
cluster_stop fast

# count SEQ N: instructions inside sharded_nextval while a session draws 1,000 then N values
count() {
    local out="$CLUSTER_DIR/cg.$1.$2"	# written by the cluster's user
    printf "SELECT count(sharded_nextval('%s')) FROM generate_series(1, 1000)\nSELECT count(sharded_nextval('%s')) FROM generate_series(1, %s)\n" \
        "$1" "$1" "$2" >"$WORK/cg.sql"
    chmod 644 "$WORK/cg.sql"
    as_pg valgrind --tool=callgrind --callgrind-out-file="$out" --toggle-collect=sharded_nextval \
        "$PGBIN/postgres" --single -D "$PGDATA" bench <"$WORK/cg.sql" >"$CLUSTER_DIR/cg.log" 2>&1
    callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}
for seq in i_node i_session; do
    a=$(count "$seq" 1000)
    b=$(count "$seq" $((DRAWS + 1000)))
    echo "$seq: $(( (b - a) / DRAWS )) instructions per draw (marginal, over $DRAWS draws)"
    [ -z "${CG_OUT:-}" ] || cp "$CLUSTER_DIR/cg.$seq.$((DRAWS + 1000))" "$CG_OUT/"
    callgrind_annotate "$CLUSTER_DIR/cg.$seq.$((DRAWS + 1000))" 2>/dev/null \
        | grep -E '^ *[0-9][0-9,]* \(' | sed -n '2,13p' | sed 's/^/    /'
done

# P2's unit: a transaction that executes a prepared statement, the whole
# backend counted (PostgreSQL's function call included), marginal over 2,000
# executions, each its own transaction
per_xact() {
    local out="$CLUSTER_DIR/cg.x.$1.$2"
    { echo "PREPARE p AS $3"; for _ in $(seq 1 "$2"); do echo "EXECUTE p"; done; } >"$WORK/cg.sql"
    chmod 644 "$WORK/cg.sql"
    as_pg valgrind --tool=callgrind --callgrind-out-file="$out" \
        "$PGBIN/postgres" --single -D "$PGDATA" bench <"$WORK/cg.sql" >"$CLUSTER_DIR/cg.log" 2>&1
    [ -z "${CG_OUT:-}" ] || [ "$2" -lt 3000 ] || cp "$out" "$CG_OUT/cg.x.$4"
    callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}
echo "per transaction (EXECUTE of a prepared statement, whole backend, marginal over 2000):"
n=0
for what in "SELECT 1" "SELECT random()" "SELECT sharded_seq.node_id()" "SELECT sharded_nextval('i_node')" "SELECT sharded_nextval('i_session')" "SELECT nextval('i_native')"; do
    n=$((n + 1))
    a=$(per_xact x 1000 "$what" "$n")
    b=$(per_xact x 3000 "$what" "$n")
    echo "    $what: $(( (b - a) / 2000 ))"
done

#!/usr/bin/env bash
# scripts/try.sh: install what is missing, build and install sharded_seq, start
# a throwaway PostgreSQL cluster with it preloaded (shared_preload_libraries,
# as the README recommends), and show it working: a table whose id comes from
# sharded_nextval, filled by four sessions at once, gets ids from 1 to about
# 1,000 in the order they were drawn (the node cache), and the background
# worker runs.  In a
# terminal it then leaves you at a psql prompt in that cluster, and removes the
# cluster when you quit.  Without a terminal it exits 0 after the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
# The cluster is pg_virtualenv's (-t: in a temporary directory, on a free
# port, removed at the end), which sets psql's connection; this script runs
# itself again inside it.
if [ -z "${SSQ_TRY_CLUSTER:-}" ]; then
    scripts/setup.sh
    echo "==> starting a throwaway PostgreSQL 15 cluster, with shared_preload_libraries = 'sharded_seq'"
    exec env -u PGHOST -u PGPORT -u PGUSER -u PGDATABASE SSQ_TRY_CLUSTER=1 \
        pg_virtualenv -t -v 15 -c "--locale=C.UTF-8 --encoding=UTF8" \
        -o shared_preload_libraries=sharded_seq bash "$0" "$@"
fi
psql -qX -d postgres -c "CREATE DATABASE demo"

run() { echo; echo "demo=# $1"; psql -X -d demo -v ON_ERROR_STOP=1 -c "$1"; }
run "CREATE EXTENSION sharded_seq"
run "SELECT sharded_seq.create_sequence('orders_id')"
run "CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT sharded_nextval('orders_id'), item text)"

echo
echo "==> four sessions insert 250 orders each, at the same time, and count them"
pids=()
for i in 1 2 3 4; do
    psql -qX -d demo -v ON_ERROR_STOP=1 \
        -c "INSERT INTO orders (item) SELECT 'session $i, item ' || g FROM generate_series(1, 250) g" \
        -c "SELECT counter_incr('orders:placed', 250)" >/dev/null &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done

run "SELECT count(*) AS orders, count(DISTINCT id) AS distinct_ids, min(id), max(id) FROM orders"
echo
echo "==> the node cache: one block in shared memory for every session, so the ids"
echo "    run from 1 to about 1,000 in the order they were drawn, whichever session drew"
run "SELECT split_part(item, ',', 1) AS session, count(*), min(id), max(id) FROM orders GROUP BY 1 ORDER BY 1"
echo
echo "==> ids skipped below the largest: a transaction that draws alone takes 16 at a time,"
echo "    and gives up the rest of those when another session draws meanwhile"
run "SELECT max(id) - count(*) AS skipped, round(100.0 * (max(id) - count(*)) / max(id), 1) AS pct FROM orders"
run "SELECT name, shards, block, tier, generation, reserved_high_water FROM sharded_seq.sequences"
run "SELECT counter_value('orders:placed')"
run "SELECT name, shards, mode, total FROM sharded_seq.counters"
run "SELECT kind, database, running FROM sharded_seq.workers ORDER BY kind"
echo
echo "Without shared_preload_libraries each session reserves a block of its own"
echo "(1,000 values): the same rows get ids spread over the sessions' blocks, not in"
echo "draw order, and no background worker runs (README.md, \"Preload or not\")."

if [ -t 0 ] && [ -t 1 ]; then
    echo
    echo "You are in psql, in database demo of a throwaway cluster (port $PGPORT)."
    echo "Try: SELECT sharded_nextval('orders_id');  SELECT counter_incr('page:1:views');"
    echo "Quit with \\q; the cluster is then removed."
    psql -X -d demo || true
fi

#!/usr/bin/env bash
# S1 and E4 across pg_dump/pg_restore: fill a table through a DEFAULT from
# several sessions, keep some counters, dump, restore into a fresh database,
# and insert more rows through the DEFAULT there from several sessions.  No
# duplicate key may occur, and every counter total and setting must survive.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_dump.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; rm -rf "$WORK"' EXIT
cluster_create "$WORK/pg"
cluster_start
db_create src
psql -qX -d src <<'SQL' >/dev/null
CREATE ROLE ss_dump_app;
SELECT sharded_seq.create_sequence('orders_id', shards => 4, block => 50);
SELECT sharded_seq.grant_sequence('orders_id', 'ss_dump_app');
CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT sharded_nextval('orders_id'), note text);
SELECT sharded_seq.create_counter('views', shards => 4);
SELECT sharded_seq.create_counter('likes', shards => 2);
SQL

insert_load() {  # insert_load DB SESSIONS ROWS_EACH
    local pids=()
    for i in $(seq 1 "$2"); do
        psql -qX -v ON_ERROR_STOP=1 -d "$1" -c \
            "INSERT INTO orders (note) SELECT 's$i' FROM generate_series(1, $3); SELECT counter_incr('views', $3), counter_incr('likes', -$i);" \
            >/dev/null 2>"$WORK/ins.$1.$i.err" &
        pids+=($!)
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    if [ $rc != 0 ]; then cat "$WORK"/ins.$1.*.err; return 1; fi
}
insert_load src 6 500
# a layout change and an advance before the dump, so generations differ
psql -qX -d src -c "SELECT sharded_seq.alter_sequence('orders_id', shards => 3, block => 70)" >/dev/null
insert_load src 4 300

snapshot() {
    psql -qXAt -d "$1" <<'SQL'
SELECT name || ' ' || shards || ' ' || block || ' ' || generation || ' ' || coalesce(acl::text, '') FROM sharded_seq.sequences;
SELECT name || ' ' || shards || ' ' || mode || ' ' || total FROM sharded_seq.counters;
SQL
}
snapshot src >"$WORK/before.txt"

pg_dump -Fc -d src -f "$WORK/src.dump"
psql -qX -d postgres -c "CREATE DATABASE restored" >/dev/null
pg_restore -d restored "$WORK/src.dump" 2>"$WORK/restore.err" || { cat "$WORK/restore.err"; exit 1; }
snapshot restored >"$WORK/after.txt"
if ! diff "$WORK/before.txt" "$WORK/after.txt"; then
    echo "state differs after restore"; exit 1
fi
echo "RESULT restored state: $(tr '\n' ';' <"$WORK/after.txt")"

# more rows through the DEFAULT in the restored database: no duplicate key
insert_load restored 6 500
rows=$(psql -qXAt -d restored -c "SELECT count(*) || ' rows, ' || count(DISTINCT id) || ' distinct ids' FROM orders")
echo "RESULT after restore and 3000 more inserts: $rows"
[ "$(psql -qXAt -d restored -c "SELECT count(*) = count(DISTINCT id) AND count(*) = 7200 FROM orders")" = t ]
total=$(psql -qXAt -d restored -c "SELECT counter_value('views')")
echo "RESULT views after restore: $total"
[ "$total" = 7200 ]
psql -qX -d postgres -c "DROP ROLE IF EXISTS ss_dump_app" >/dev/null 2>&1 || true

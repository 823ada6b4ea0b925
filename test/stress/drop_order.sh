#!/usr/bin/env bash
# drop_counter() writes its changes in the order a subscriber must apply them:
# the counter_config row first, then the counter's shard rows, as alter_counter
# locks them (config row, then rows).  In the other order, a subscriber's apply
# worker locks shard rows before the config row and can deadlock with an
# alter_counter running there.  Read from a logical decoding slot.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_droporder.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; rm -rf "$WORK"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
q() { psql -qXAt -v ON_ERROR_STOP=1 -d stress -c "$1"; }
cluster_create "$WORK/pg"
cat >>"$PGDATA/postgresql.conf" <<'CONF'
shared_preload_libraries = 'sharded_seq'
wal_level = logical
max_replication_slots = 4
CONF
cluster_start
db_create stress
for mode in exact buffered memcached; do
    q "SELECT sharded_seq.create_counter('c_$mode', shards => 3, mode => '$mode')" >/dev/null
    q "SELECT counter_incr('c_$mode', 5)" >/dev/null
    q "SELECT 'slot' FROM pg_create_logical_replication_slot('s_$mode', 'test_decoding')" >/dev/null
    q "SELECT sharded_seq.drop_counter('c_$mode')" >/dev/null
    order="$(q "SELECT string_agg(CASE WHEN data LIKE 'table sharded_seq.counter_config: DELETE%' THEN 'config'
                                      WHEN data LIKE 'table sharded_seq.counter_shards: DELETE%' THEN 'shard' END, ' ' ORDER BY ordinality)
                FROM pg_logical_slot_get_changes('s_$mode', NULL, NULL) WITH ORDINALITY
               WHERE data LIKE 'table sharded_seq.counter_%: DELETE%'")"
    q "SELECT pg_drop_replication_slot('s_$mode')" >/dev/null
    echo "RESULT drop_counter of a '$mode' counter decodes as: $order"
    [ "$order" = "config shard shard shard" ] || fail "drop_counter('c_$mode') writes '$order', not the config row before its 3 shard rows"
done
echo "drop order test passed"

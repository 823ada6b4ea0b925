#!/usr/bin/env bash
# Node ids on one server: sharded_seq.node_id = 5, with memcached and the
# library preloaded (buffered counters, the background worker).  The checks
# are the pgTAP file next to this script: values in node 5's range (both
# tiers, up to S5's error at the range's end), object ids 5 + 1024k, counter
# rows 5 * 1024 + s written (commits, growth on a node that has none yet,
# alter_counter, maintain(), both write-behind flushes) while every node's
# rows count in totals, counter_incr refusing to create, another system's
# claim refused with both claims named, and a reload that changes the id.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_node_ids.XXXXXX)"
chmod 755 "$WORK"
cleanup() {
    memcached_kill KILL
    cluster_destroy >/dev/null 2>&1 || true
    if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

MC_PORT="$(free_port)"
memcached_start "$MC_PORT"
cluster_create "$WORK/pg"
cat >>"$PGDATA/postgresql.conf" <<CONF
shared_preload_libraries = 'sharded_seq'
sharded_seq.memcached_servers = '127.0.0.1:$MC_PORT'
sharded_seq.node_id = 5
CONF
cluster_start
db_create nodes pgtap
cp "$HERE/node_ids.sql" "$WORK/"
[ "$(id -u)" = 0 ] && chown -R postgres: "$WORK/node_ids.sql"
pg_prove -d nodes "$WORK/node_ids.sql"

# An UPDATE of this server's own claim, still in progress: the dirty
# snapshot shows both versions of the row, which are one claim, not two
# (a first version of 1.4 refused every draw meanwhile).
q() { psql -qXAt -v ON_ERROR_STOP=1 -d nodes -c "$1"; }
q "SELECT sharded_seq.create_sequence('claim_upd'), sharded_seq.create_counter('claim_upd_c')" >/dev/null
q "SELECT sharded_nextval('claim_upd')" >/dev/null
session_open U nodes
session_send U "BEGIN; UPDATE sharded_seq.node_claims SET claimed_at = claimed_at + interval '1 second' WHERE node_id = 5;"
session_sync U
got="$(psql -qXAt -d nodes -c "SELECT sharded_nextval('claim_upd') > 0, counter_incr('claim_upd_c') > 0" 2>&1 || true)"
session_send U "ROLLBACK;"
session_close U
echo "RESULT a draw and an increment while this server's claim is being updated: $got (want t|t)"
[ "$got" = "t|t" ] || { echo "FAILED: an update of this server's own claim refused its draws"; exit 1; }

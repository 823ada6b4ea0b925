#!/usr/bin/env bash
# node_claims across ALTER EXTENSION ... UPDATE from 1.3 to 1.4, whose key
# goes from node_id alone to (node_id, system_identifier, database), on a
# database that publishes node_claims.  The 1.4 library claims a node id on
# the 1.3 schema; after the update every claim is kept, the publication
# still lets claims be deleted (the table kept a replica identity), a second
# system's claim of the same id stands beside this one's and, dated earlier,
# refuses this server; and node_claims (columns, constraints, indexes,
# triggers, replica identity) and claim_received() are those of a fresh 1.4.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_claims_update.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; rm -rf "$WORK"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
q() { psql -qXAt -v ON_ERROR_STOP=1 -d "$1" -c "$2"; }

cluster_create "$WORK/pg"
cluster_start
psql -qXAt -v ON_ERROR_STOP=1 -d postgres -c "LOAD 'sharded_seq'" \
    -c "ALTER SYSTEM SET sharded_seq.node_id = 3" -c "SELECT pg_reload_conf()" >/dev/null
for _ in $(seq 1 100); do
    [ "$(psql -qXAt -d postgres -c "LOAD 'sharded_seq'" -c "SHOW sharded_seq.node_id")" = 3 ] && break
    sleep 0.1
done
[ "$(psql -qXAt -d postgres -c "LOAD 'sharded_seq'" -c "SHOW sharded_seq.node_id")" = 3 ] || fail "the server did not take node id 3"
sysid="$(q postgres "SELECT system_identifier FROM pg_control_system()")"
claims() { q "$1" "SELECT string_agg(node_id || '/' || system_identifier || '/' || database || '/' || claimed_at, ' ' ORDER BY node_id, system_identifier) FROM sharded_seq.node_claims"; }

q postgres "CREATE DATABASE old" >/dev/null
psql -qX -v ON_ERROR_STOP=1 -d old >/dev/null <<'SQL'
CREATE EXTENSION sharded_seq VERSION '1.3';
SELECT sharded_seq.create_sequence('s');
SELECT sharded_nextval('s');
INSERT INTO sharded_seq.node_claims VALUES (9, '42', 'elsewhere', '2020-01-01 00:00:00+00');
SET client_min_messages = error;  -- wal_level is replica here: the publication is only looked at
CREATE PUBLICATION claims FOR TABLE sharded_seq.node_claims;
SQL
before="$(claims old)"
echo "RESULT claims on 1.3, the first made by the 1.4 library: $before"
[[ "$before" == "3/$sysid/old/"*" 9/42/elsewhere/"* ]] || fail "unexpected claims on 1.3: $before"

q old "ALTER EXTENSION sharded_seq UPDATE TO '1.4'" >/dev/null
after="$(claims old)"
[ "$after" = "$before" ] || fail "claims changed across the update: $before -> $after"
echo "RESULT claims kept across the update"
[ "$(q old "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'node_claims_pkey'")" = \
  "PRIMARY KEY (node_id, system_identifier, database)" ] || fail "node_claims' key is not the three columns"
q old "DELETE FROM sharded_seq.node_claims WHERE node_id = 9" >/dev/null \
    || fail "a claim of the published table cannot be deleted after the update"
[ "$(q old "SELECT count(*) FROM pg_publication_tables WHERE pubname = 'claims'")" = 1 ] || fail "the publication lost node_claims"
echo "RESULT the published node_claims keeps a replica identity (a claim deleted)"

# another system's claim of node 3, dated earlier, beside this one's
q old "INSERT INTO sharded_seq.node_claims VALUES (3, '42', 'elsewhere', '2020-01-01 00:00:00+00')" >/dev/null
out="$(psql -qXAt -v VERBOSITY=verbose -d old -c "SELECT sharded_nextval('s')" 2>&1 || true)"
echo "$out" | grep -q "ERROR:  55000: sharded_seq.node_id 3 is claimed by system 42, database \"elsewhere\", earlier than by this one (system $sysid, database \"old\")" \
    || fail "an earlier claim beside this one's did not refuse: $out"
q old "DELETE FROM sharded_seq.node_claims WHERE node_id = 3 AND system_identifier = '42'" >/dev/null
q old "SELECT sharded_nextval('s') >> 53" | grep -qx 3 || fail "the earlier claim deleted, this server does not draw"
echo "RESULT a second claim of node 3 stands beside this one's, and refuses this server while it is the earlier"

# the same objects as a fresh 1.4
q postgres "CREATE DATABASE fresh" >/dev/null
q fresh "CREATE EXTENSION sharded_seq" >/dev/null
describe() {
    psql -qXAt -v ON_ERROR_STOP=1 -d "$1" <<'SQL'
SELECT 'column ' || attname || ' ' || format_type(atttypid, atttypmod) || ' ' || attnotnull || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
  FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE attrelid = 'sharded_seq.node_claims'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum;
SELECT 'constraint ' || conname || ' ' || contype::text || ' ' || pg_get_constraintdef(oid)
  FROM pg_constraint WHERE conrelid = 'sharded_seq.node_claims'::regclass ORDER BY conname;
SELECT 'index ' || pg_get_indexdef(indexrelid) || ' ' || indisprimary || ' ' || indisreplident
  FROM pg_index WHERE indrelid = 'sharded_seq.node_claims'::regclass ORDER BY 1;
SELECT 'trigger ' || pg_get_triggerdef(oid) || ' ' || tgenabled::text
  FROM pg_trigger WHERE tgrelid = 'sharded_seq.node_claims'::regclass ORDER BY tgname;
SELECT 'replica identity ' || relreplident::text FROM pg_class WHERE oid = 'sharded_seq.node_claims'::regclass;
SELECT 'function ' || p.oid::regprocedure || ' ' || prosrc || ' ' || probin || ' ' || coalesce(proacl::text, '') || ' '
       || (SELECT count(*) FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
  FROM pg_proc p WHERE proname = 'claim_received' AND pronamespace = 'sharded_seq'::regnamespace;
SQL
}
describe old >"$WORK/old.txt"
describe fresh >"$WORK/fresh.txt"
diff -u "$WORK/fresh.txt" "$WORK/old.txt" || fail "node_claims after the update differs from a fresh 1.4 (above)"
echo "RESULT node_claims after the update equals a fresh 1.4's: $(grep -c . "$WORK/fresh.txt") catalog lines"
echo "claims update test passed"

#!/usr/bin/env bash
# A fresh install of the control file's default_version and an install of
# every earlier version updated to it (ALTER EXTENSION UPDATE) hold the same
# objects: the extension's members, every function's definition and rights,
# views, tables with their columns, constraints, indexes, triggers (and
# when they fire), rights and comments.  pg_dump leaves an extension's
# members out, so the catalogs are compared directly.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_same.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; rm -rf "$WORK"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

default="$(sed -n "s/^default_version *= *'\(.*\)'/\1/p" "$ROOT_DIR/sharded_seq.control")"
older=()
for f in "$ROOT_DIR"/sharded_seq--*.sql; do
    v="${f##*/sharded_seq--}"
    v="${v%.sql}"
    [[ "$v" == *--* || "$v" == "$default" ]] && continue
    older+=("$v")
done
if [ ${#older[@]} = 0 ]; then
    echo "SKIP no version older than $default has a full install script"
    exit 77
fi

cluster_create "$WORK/pg"
echo "shared_preload_libraries = 'sharded_seq'" >>"$PGDATA/postgresql.conf"
cluster_start

objects() {
    psql -qXAt -v ON_ERROR_STOP=1 -d "$1" <<'SQL'
SELECT 'member ' || pg_describe_object(classid, objid, objsubid)
  FROM pg_depend WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'sharded_seq')
 ORDER BY 1;
SELECT 'function ' || p.oid::regprocedure || ' ' || coalesce(p.proacl::text, '-') || ' '
       || coalesce(obj_description(p.oid, 'pg_proc'), '-') || E'\n' || pg_get_functiondef(p.oid)
  FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'sharded_seq')
 ORDER BY p.oid::regprocedure::text;
SELECT 'relation ' || c.oid::regclass || ' ' || c.relkind::text || ' ' || coalesce(c.relacl::text, '-') || ' '
       || coalesce((SELECT string_agg(o, ',' ORDER BY o) FROM unnest(c.reloptions) o), '-') || ' '
       || coalesce(obj_description(c.oid, 'pg_class'), '-')
       || CASE WHEN c.relkind = 'v' THEN E'\n' || pg_get_viewdef(c.oid) ELSE '' END
  FROM pg_class c WHERE c.relnamespace = 'sharded_seq'::regnamespace
 ORDER BY c.oid::regclass::text;
SELECT 'column ' || a.attrelid::regclass || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END || ' '
       || coalesce(pg_get_expr(ad.adbin, ad.adrelid), '-')
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
 WHERE c.relnamespace = 'sharded_seq'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attrelid::regclass::text, a.attname;
SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
  FROM pg_constraint WHERE connamespace = 'sharded_seq'::regnamespace ORDER BY 1;
SELECT 'index ' || pg_get_indexdef(indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
 WHERE c.relnamespace = 'sharded_seq'::regnamespace ORDER BY 1;
SELECT 'trigger ' || tgname || ' ' || tgenabled::text || ' ' || pg_get_triggerdef(t.oid)
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relnamespace = 'sharded_seq'::regnamespace AND NOT t.tgisinternal ORDER BY 1;
SQL
}

psql -qX -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE fresh" >/dev/null
psql -qX -v ON_ERROR_STOP=1 -d fresh -c "CREATE EXTENSION sharded_seq" >/dev/null
objects fresh >"$WORK/fresh.txt"
n="$(grep -c '^member ' "$WORK/fresh.txt")"
[ "$n" -gt 20 ] || fail "a fresh $default lists only $n members"
bad=0
for v in "${older[@]}"; do
    db="from_${v//./_}"
    psql -qX -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE $db" >/dev/null
    psql -qX -v ON_ERROR_STOP=1 -d "$db" -c "CREATE EXTENSION sharded_seq VERSION '$v'" \
        -c "ALTER EXTENSION sharded_seq UPDATE" >/dev/null
    objects "$db" >"$WORK/$db.txt"
    lines="$(diff "$WORK/fresh.txt" "$WORK/$db.txt" | grep -c '^[<>]' || true)"
    echo "RESULT $v updated to $default: $lines lines differ from a fresh $default ($n members)"
    if [ "$lines" != 0 ]; then
        diff "$WORK/fresh.txt" "$WORK/$db.txt" | head -n 20
        bad=1
    fi
done
[ $bad = 0 ] || fail "an updated install differs from a fresh one"

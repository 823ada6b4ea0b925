#!/usr/bin/env bash
# Every install of the control file's default_version holds the objects
# recorded for this PostgreSQL major in objects_DEFAULT.pgMAJOR.expected
# (the golden file; the catalogs print differently on each major: views,
# the owner's rights from 17 on, row types and NOT NULL constraints):
#  (a) a fresh CREATE EXTENSION;
#  (b) every earlier version the update scripts reach from the base script,
#      installed with VERSION and brought up in one ALTER EXTENSION UPDATE;
#  (c) the base version updated one version at a time.
# Objects: what test/versions/objects.sql reads from the catalogs (members,
# function definitions and rights, relations, views, columns, constraints,
# indexes, triggers and when they fire, rights, comments, dumped tables).
# The install scripts are one base (sharded_seq--1.0.sql) and the update
# chain, as in contrib, so (a) and (b) run the same scripts: the golden file
# is what tells a change to the objects.  A mismatch prints the diff.
#
# To change the objects deliberately (a new version, a changed update
# script), write the golden files from a fresh install, then review the diff:
#   SSQ_REGENERATE=1 flock /tmp/ssq-host.lock scripts/test.sh versions/same_objects
#   scripts/chroot.sh trixie env SSQ_REGENERATE=1 scripts/test.sh versions/same_objects
#   scripts/chroot.sh sid env SSQ_REGENERATE=1 scripts/test.sh versions/same_objects
# and copy each chroot's file from its copy of the tree
# (/var/cache/sharded_seq/chroot-SUITE/build/sharded_seq/test/versions/).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_same.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; rm -rf "$WORK"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

default="$(sed -n "s/^default_version *= *'\(.*\)'/\1/p" "$ROOT_DIR/sharded_seq.control")"
[ -n "$default" ] || fail "no default_version in sharded_seq.control"

# the versions the base script and its update chain provide
reach=()
mapfile -t reach < <(install_versions) && [ ${#reach[@]} -gt 0 ] || fail "no install scripts"
base="${reach[0]}"
[[ " ${reach[*]} " == *" $default "* ]] || fail "the update scripts do not reach $default from $base (${reach[*]})"
[ "${reach[-1]}" = "$default" ] || fail "the update scripts reach ${reach[-1]}, beyond default_version $default"
older=("${reach[@]:0:${#reach[@]}-1}")
echo "RESULT base $base, update chain to ${reach[*]:1}; earlier versions: ${older[*]:-none}"

# CREATE EXTENSION prefers a full script to the chain: a full script of a
# later version left installed from an older tree would be tested instead.
ext="$("$PGBIN/pg_config" --sharedir)/extension"
installed="$(cd "$ext" && ls sharded_seq--*.sql 2>/dev/null | sort | tr '\n' ' ' || true)"
shipped="$(cd "$ROOT_DIR" && ls sharded_seq--*.sql | sort | tr '\n' ' ')"
[ "$installed" = "$shipped" ] || fail "$ext holds $installed; this tree ships $shipped (scripts/setup.sh removes the others)"

cluster_create "$WORK/pg"
echo "shared_preload_libraries = 'sharded_seq'" >>"$PGDATA/postgresql.conf"
cluster_start
major="$(( $(psql -qXAt -d postgres -c "SHOW server_version_num") / 10000 ))"
GOLDEN="$HERE/objects_$default.pg$major.expected"
name="${GOLDEN##*/}"

objects() { psql -qXAt -v ON_ERROR_STOP=1 -d "$1" -f "$HERE/objects.sql"; }
extversion() { psql -qXAt -d "$1" -c "SELECT extversion FROM pg_extension WHERE extname = 'sharded_seq'"; }
bad=0
# compare NAME DB: DB's objects against the golden file.  The diffs are kept
# for the end, where every install's RESULT line is above them.
compare() {
    objects "$2" >"$WORK/$2.txt"
    local v lines
    v="$(extversion "$2")"
    lines="$(diff "$WORK/expected.txt" "$WORK/$2.txt" | grep -c '^[<>]' || true)"
    echo "RESULT $1: version $v, $lines lines differ from $name"
    if [ "$lines" != 0 ] || [ "$v" != "$default" ]; then
        diff -u --label "$name" --label "$1" "$WORK/expected.txt" "$WORK/$2.txt" >>"$WORK/diffs" || true
        bad=1
    fi
}

psql -qX -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE fresh" >/dev/null
psql -qX -v ON_ERROR_STOP=1 -d fresh -c "CREATE EXTENSION sharded_seq" >/dev/null
if [ -n "${SSQ_REGENERATE:-}" ]; then
    {
        echo "# The objects of a fresh sharded_seq $default on PostgreSQL $major (test/versions/objects.sql),"
        echo "# which test/versions/same_objects.sh compares every install and update against."
        echo "# Regenerate only to change the objects deliberately (see that test), and review the diff."
        objects fresh
    } >"$GOLDEN"
    echo "RESULT regenerated ${GOLDEN#"$ROOT_DIR"/}"
fi
[ -f "$GOLDEN" ] || fail "no golden file ${GOLDEN#"$ROOT_DIR"/}: see the comment at the top of this test"
sed -n '/^[^#]/,$p' "$GOLDEN" >"$WORK/expected.txt"
n="$(grep -c '^member ' "$WORK/expected.txt" || true)"
[ "$n" -gt 20 ] || fail "the golden file lists only $n members"

# (a)
compare "a fresh CREATE EXTENSION" fresh
# (b)
for v in "${older[@]}"; do
    db="from_${v//./_}"
    psql -qX -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE $db" >/dev/null
    psql -qX -v ON_ERROR_STOP=1 -d "$db" -c "CREATE EXTENSION sharded_seq VERSION '$v'" >/dev/null
    [ "$(extversion "$db")" = "$v" ] || fail "CREATE EXTENSION ... VERSION '$v' installed $(extversion "$db")"
    psql -qX -v ON_ERROR_STOP=1 -d "$db" -c "ALTER EXTENSION sharded_seq UPDATE" >/dev/null
    compare "$v updated to $default" "$db"
done
# (c)
psql -qX -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE steps" >/dev/null
psql -qX -v ON_ERROR_STOP=1 -d steps -c "CREATE EXTENSION sharded_seq VERSION '$base'" >/dev/null
for v in "${reach[@]:1}"; do
    psql -qX -v ON_ERROR_STOP=1 -d steps -c "ALTER EXTENSION sharded_seq UPDATE TO '$v'" >/dev/null
    [ "$(extversion steps)" = "$v" ] || fail "ALTER EXTENSION ... UPDATE TO '$v' left $(extversion steps)"
done
compare "$base updated in steps (${reach[*]:1})" steps

if [ $bad != 0 ]; then
    head -n 40 "$WORK/diffs"
    fail "an install differs from $name (the first 40 lines of the diffs are above)"
fi

#!/usr/bin/env bash
# test/cross_major/restore_newer.sh SRC_CONNINFO < DUMP: the newer-major side
# of test/cross_major/dump_15_to_17.sh, run in the chroot (PG_MAJOR set
# there).  Builds and installs the extension and, in a throwaway
# pg_virtualenv cluster, restores DUMP (taken by the older pg_dump) into one
# database and a dump by this major's pg_dump of the older server (database
# src at SRC_CONNINFO) into another, and checks each against the older
# server: the same sequences and counter totals, then no repeated value, and
# counters that keep counting.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC="$1"
if [ -z "${SSQ_CROSS_MAJOR_SIDE:-}" ]; then
    WERROR=1 scripts/setup.sh >/dev/null
    exec env -u PGPORT SSQ_CROSS_MAJOR_SIDE="$PG_MAJOR" pg_virtualenv -t -v "$PG_MAJOR" bash "$0" "$@"
fi
source test/cross_major/draw.sh
WORK="$(mktemp -d /tmp/ss_newer.XXXXXX)"
chmod 755 "$WORK"
trap 'rm -rf "$WORK"' EXIT
cat >"$WORK/old.dump"
src() { psql -qXAt -d "$SRC" "$@"; }
state | src >"$WORK/before.txt"
echo "RESULT PostgreSQL $(src -c 'SHOW server_version') -> $(psql -qXAt -c 'SHOW server_version')"

pg_dump -Fc -d "$SRC" -f "$WORK/new.dump"
# A 15.20 server keeps an internal column option, pg_attver, that 15.20's
# pg_dump leaves out and that servers from earlier minor releases (such as
# trixie's 17.11) neither know nor filter: their pg_dump copies it, and
# their server refuses it.  Such a dump cannot be restored, whatever the
# extension; it is reported, and at least one dump must be restored.
knows_attver=yes
psql -qX -c "CREATE TEMP TABLE t (a int); ALTER TABLE t ALTER COLUMN a SET (pg_attver = 1)" \
    >/dev/null 2>&1 || knows_attver=no
restored=0
for how in "older pg_dump" "pg_dump $PG_MAJOR"; do
    db="restored_${how//[^a-z0-9]/_}"
    dump="$WORK/old.dump"
    [ "$how" = "older pg_dump" ] || dump="$WORK/new.dump"
    pg_restore -f "$WORK/dump.sql" "$dump"
    if [ $knows_attver = no ] && grep -q 'pg_attver=' "$WORK/dump.sql"; then
        echo "RESULT $how: not restorable into $(psql -qXAt -c 'SHOW server_version'): the dump sets column option pg_attver, which this server refuses"
        continue
    fi
    psql -qX -v ON_ERROR_STOP=1 -c "CREATE DATABASE $db" >/dev/null
    pg_restore -d "$db" "$dump" 2>"$WORK/restore.err" || { cat "$WORK/restore.err"; exit 1; }
    restored=$((restored + 1))
    state | psql -qXAt -d "$db" >"$WORK/after.txt"
    diff "$WORK/before.txt" "$WORK/after.txt" || { echo "$how: state differs after the restore"; exit 1; }
    echo "RESULT $how: restored state matches: $(tr '\n' ';' <"$WORK/after.txt")"

    draw_sessions "$db" after 4 db_seq db1_seq mc_seq
    psql -qX -v ON_ERROR_STOP=1 -d "$db" >/dev/null <<'SQL'
INSERT INTO orders (note) SELECT 'after' FROM generate_series(1, 500);
INSERT INTO drawn SELECT 'db_seq', id, 'after' FROM orders WHERE note = 'after';
SELECT counter_incr('exact_c', 7), counter_incr('buf_c', 7), counter_incr('neg_c', -7);
SQL
    check="$(check_drawn "$db")"
    echo "RESULT $how: $check"
    [[ "$check" == *" OK" ]]
    echo "RESULT $how: counters after one more increment each: $(totals "$db")"
    [ "$(totals "$db")" = "buf_c=507 exact_c=257 neg_c=-257" ]
done
[ $restored -ge 1 ] || { echo "no dump could be restored"; exit 1; }

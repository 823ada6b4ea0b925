#!/usr/bin/env bash
# E4 across majors: a database on PostgreSQL 15 (the host) with sequences
# (database tier with 4 shards and with 1, memcached tier) and counters
# (exact, memcached, negative deltas), used from several sessions, is dumped
# and restored into PostgreSQL 17 (the trixie chroot): from 17's pg_dump
# reading the 15 server, and from 15's own pg_dump when 17 can read it (see
# restore_newer.sh, the 17 side).  Every counter total and every sequence's
# layout must be kept, and later values must repeat none handed out before
# the dump (check_drawn: t/ShardedSeq/check_drawn.sql).
#
# Each side's server is a throwaway pg_virtualenv cluster (-t: in a temporary
# directory, on a free port), which also sets psql's connection; the script
# runs itself again inside it.  Needs root (chroot).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ]; then
    echo "SKIP the PostgreSQL 17 side runs in a chroot, which needs root"
    exit 77
fi
if [ -z "${SSQ_CROSS_MAJOR_SIDE:-}" ]; then
    exec env -u PGPORT -u PGHOST -u PGUSER -u PGDATABASE SSQ_CROSS_MAJOR_SIDE=15 \
        pg_virtualenv -t -v 15 bash "$0" "$@"
fi
source test/cross_major/draw.sh
WORK="$(mktemp -d /tmp/ss_xmajor.XXXXXX)"
chmod 755 "$WORK"
trap 'rm -rf "$WORK"' EXIT

psql -qX -v ON_ERROR_STOP=1 -c "CREATE DATABASE src" >/dev/null
psql -qX -v ON_ERROR_STOP=1 -d src >/dev/null <<'SQL'
CREATE EXTENSION sharded_seq;
SELECT sharded_seq.create_sequence('db_seq', shards => 4, block => 20);
SELECT sharded_seq.create_sequence('db1_seq', shards => 1, block => 20);
SELECT sharded_seq.create_sequence('mc_seq', tier => 'memcached', block => 400);
CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT sharded_nextval('db_seq'), note text);
SELECT sharded_seq.create_counter('exact_c', shards => 4);
SELECT sharded_seq.create_counter('buf_c', shards => 2, mode => 'memcached');
SELECT sharded_seq.create_counter('neg_c', shards => 3);
CREATE TABLE drawn (seq text, v bigint, phase text);
SQL
draw_sessions src before 4 db_seq db1_seq mc_seq
pids=()
for i in 1 2 3 4; do
    psql -qX -v ON_ERROR_STOP=1 -d src >/dev/null 2>"$WORK/inc.$i.err" <<SQL &
INSERT INTO orders (note) SELECT 's$i' FROM generate_series(1, 200);
SELECT counter_incr('exact_c', $i), counter_incr('buf_c', 2 * $i), counter_incr('neg_c', -$i) FROM generate_series(1, 25);
BEGIN;
SELECT counter_incr('exact_c', 1000), counter_incr('buf_c', 1000), counter_incr('neg_c', 1000);
ROLLBACK;
SQL
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { cat "$WORK"/inc.*.err; exit 1; }; done
psql -qX -v ON_ERROR_STOP=1 -d src -c "INSERT INTO drawn SELECT 'db_seq', id, 'before' FROM orders" >/dev/null
echo "RESULT on 15: $(totals src); $(psql -qXAt -d src -c "SELECT count(*) FROM drawn") values drawn"
# 25 increments of i, 2i and -i from sessions 1..4
[ "$(totals src)" = "buf_c=500 exact_c=250 neg_c=-250" ] || { echo "totals on 15 are wrong"; exit 1; }

pg_dump -Fc -d src -f "$WORK/src15.dump"
echo "RESULT dumped with $(pg_dump --version)"
# the 17 side reads this server over loopback, with its password
scripts/chroot.sh trixie bash test/cross_major/restore_newer.sh \
    "host=127.0.0.1 port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=src" <"$WORK/src15.dump"

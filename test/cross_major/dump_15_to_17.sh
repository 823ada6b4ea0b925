#!/usr/bin/env bash
# E4 across majors: a database on PostgreSQL 15 (the host) with sequences
# (database tier with 4 shards and with 1, memcached tier) and counters
# (exact, memcached, negative deltas), used from several sessions, is dumped
# and restored into PostgreSQL 17 (the trixie chroot): from 17's pg_dump
# reading the 15 server, and from 15's own pg_dump when 17 can read it (see
# restore_newer.sh).  Every counter total
# and every sequence's layout must be kept, and later values must repeat
# none handed out before the dump (check_drawn: t/ShardedSeq/check_drawn.sql).
# The 17 side is test/cross_major/restore_newer.sh.  Needs root (chroot).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
export PG_MAJOR=15
source "$HERE/../../scripts/lib.sh"
if [ "$(id -u)" != 0 ]; then
    echo "SKIP the PostgreSQL 17 side runs in a chroot, which needs root"
    exit 77
fi
WORK="$(mktemp -d /tmp/ss_xmajor.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; rm -rf "$WORK"' EXIT
cluster_create "$WORK/pg"
# the 17 side connects over loopback, as postgres, with 17's pg_dump
cluster_start
db_create src
psql -qX -v ON_ERROR_STOP=1 -d src >/dev/null <<'SQL'
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
totals="$(psql -qXAt -d src -c "SELECT string_agg(name || '=' || counter_value(name), ' ' ORDER BY name) FROM sharded_seq.counters")"
echo "RESULT on 15: $totals; $(psql -qXAt -d src -c "SELECT count(*) FROM drawn") values drawn"
# 25 increments of i, 2i and -i from sessions 1..4
[ "$totals" = "buf_c=500 exact_c=250 neg_c=-250" ] || { echo "totals on 15 are wrong"; exit 1; }

"$PGBIN/pg_dump" -Fc -d src -f "$WORK/src15.dump"
echo "RESULT dumped with $("$PGBIN/pg_dump" --version)"
"$ROOT_DIR/scripts/chroot.sh" trixie bash test/cross_major/restore_newer.sh "$PGPORT" <"$WORK/src15.dump"

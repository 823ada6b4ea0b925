#!/usr/bin/env bash
# S1 and C1/C2 across a cutover by logical replication from PostgreSQL 15
# (the host) to 17 (the trixie chroot), issue 22.  The 15 publisher
# (preloaded, wal_level logical) has a node-cached and a session-cached
# sequence drawn by DEFAULT in table orders, an exact and a buffered
# counter, 2,000 rows, and a publication FOR ALL TABLES.  Writers insert
# orders and increment both counters, every fifth transaction rolled back,
# and print every id they are handed (the record outside the database),
# until the 17 side (cutover_newer.sh) has subscribed, been refused before
# the call, called sharded_seq.cutover(), compared rows and counters with
# the publisher, dropped the subscription and inserted with its own writers.
# No id may come twice across both sides.  Needs root (chroot).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ]; then
    echo "SKIP the PostgreSQL 17 side runs in a chroot, which needs root"
    exit 77
fi
if [ -z "${SSQ_CROSS_MAJOR_SIDE:-}" ]; then
    exec env -u PGPORT -u PGHOST -u PGUSER -u PGDATABASE SSQ_CROSS_MAJOR_SIDE=15 \
        pg_virtualenv -t -v 15 -o wal_level=logical -o shared_preload_libraries=sharded_seq \
        -o max_worker_processes=16 bash "$0" "$@"
fi
WORK="$(mktemp -d /tmp/ss_xcutover.XXXXXX)"
chmod 755 "$WORK"
writers=()
trap 'touch "$WORK/stop"; for p in "${writers[@]}"; do wait "$p" 2>/dev/null || true; done; rm -rf "$WORK"' EXIT

psql -qX -v ON_ERROR_STOP=1 -c "CREATE DATABASE app" >/dev/null
psql -qX -v ON_ERROR_STOP=1 -d app >/dev/null <<'SQL'
CREATE EXTENSION sharded_seq;
SELECT sharded_seq.create_sequence('orders_id', block => 50);
SELECT sharded_seq.create_sequence('tickets_id', block => 20, cache => 'session');
CREATE TABLE orders (
    id     bigint PRIMARY KEY DEFAULT sharded_nextval('orders_id'),
    ticket bigint UNIQUE NOT NULL DEFAULT sharded_nextval('tickets_id'),
    w      integer NOT NULL
);
SELECT sharded_seq.create_counter('orders_exact');
SELECT sharded_seq.create_counter('orders_buf', mode => 'buffered');
INSERT INTO orders (w) SELECT 0 FROM generate_series(1, 2000);
SELECT counter_incr('orders_exact', 2000), counter_incr('orders_buf', 2000);
CREATE PUBLICATION p FOR ALL TABLES;
SQL
pg_dump -s -d app -f "$WORK/schema.sql"

# writers, in batches of 20 transactions, until the 17 side is done
for s in 1 2 3 4; do
    batch=""
    for k in $(seq 1 20); do
        if [ $((k % 5)) = 0 ]; then end=ROLLBACK tag=rb; else end=COMMIT tag=c; fi
        batch+="BEGIN; INSERT INTO orders (w) VALUES ($s) RETURNING '$tag ' || id || ' ' || ticket;
SELECT 'n', counter_incr('orders_exact'), counter_incr('orders_buf'); $end;
"
    done
    echo "$batch" >"$WORK/batch.$s.sql"
    (while [ ! -e "$WORK/stop" ]; do
        psql -qXAt -d app -f "$WORK/batch.$s.sql" >>"$WORK/writer.$s.out" 2>>"$WORK/writer.$s.err" || true
    done) &
    writers+=($!)
done
until [ "$(cat "$WORK"/writer.*.out 2>/dev/null | grep -c '^c ')" -ge 200 ]; do sleep 0.1; done

scripts/chroot.sh trixie bash test/cross_major/cutover_newer.sh \
    "host=127.0.0.1 port=$PGPORT user=$PGUSER password=$PGPASSWORD dbname=app" \
    <"$WORK/schema.sql" | tee "$WORK/newer.out" | grep -E '^(RESULT|CHECK)'
touch "$WORK/stop"
for p in "${writers[@]}"; do wait "$p" || true; done
writers=()

fail=0
grep -q '^CHECK BAD' "$WORK/newer.out" && fail=1
[ "$(grep -c '^CHECK ok' "$WORK/newer.out")" -ge 9 ] || { echo "the 17 side did not finish its checks"; fail=1; }
grep -q 'stopped by a cutover' "$WORK"/writer.*.err || { echo "no writer on 15 was refused"; fail=1; }
old="$(cat "$WORK"/writer.*.out | grep -cE '^(c|rb) ')"
new="$(grep -c '^NEW ' "$WORK/newer.out")"
for col in 2 3; do
    dups="$({ cat "$WORK"/writer.*.out | grep -E '^(c|rb) '; grep '^NEW ' "$WORK/newer.out"; } |
        cut -d ' ' -f $col | sort | uniq -d | head -n 5)"
    what=$([ $col = 2 ] && echo orders_id || echo tickets_id)
    if [ -n "$dups" ]; then echo "$what: handed out twice: $dups"; fail=1; fi
    echo "RESULT $what: $old values handed out on 15 (committed or rolled back), $new on 17, none twice: $([ -z "$dups" ] && echo yes || echo NO)"
done
[ "$new" = 1200 ] || { echo "the 17 side handed out $new values, expected 1200"; fail=1; }
exit $fail

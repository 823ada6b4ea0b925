#!/usr/bin/env bash
# E5: a session's memory stays bounded however many counters and sequences
# it touches, and eviction from its caches loses nothing.
#   - one session reads and increments 100,000 distinct counters (in
#     transactions of 10,000): its memory contexts total under 16 MB, while a
#     session allowed to cache them all grows past that (the bound is real);
#   - with the smallest cache (16 entries), one transaction increments 1,000
#     counters, some in a rolled-back savepoint: every total is exact;
#   - the same cache, 40 sequences drawn from in turn: values increase per
#     sequence and sharded_currval survives eviction.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_memory.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
cluster_create "$WORK/pg"
cluster_start
db_create stress
q() { psql -qXAt -v ON_ERROR_STOP=1 -d stress "$@"; }
fail() { echo "FAILED: $*"; exit 1; }
N=100000
LIMIT=$((16 * 1024 * 1024))

q -c "SELECT count(counter_incr('m' || g)) FROM generate_series(1, $N) g" >/dev/null
q >/dev/null <<'SQL'
CREATE PROCEDURE touch_all(n int) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 0 .. n / 10000 - 1 LOOP
        PERFORM counter_incr('m' || g) FROM generate_series(i * 10000 + 1, (i + 1) * 10000) g;
        COMMIT;
    END LOOP;
END $$;
SQL
touch_all() {  # touch_all [SET ...]: the memory one session ends with
    q -c "${1:-SELECT 1}" -c "SELECT count(counter_value('m' || g)) FROM generate_series(1, $N) g" \
      -c "CALL touch_all($N)" -c "SELECT sum(total_bytes) FROM pg_backend_memory_contexts" | tail -1
}
bounded=$(touch_all)
unbounded=$(touch_all "SET sharded_seq.session_cache_size = 10000000")
echo "RESULT memory after touching $N counters: $((bounded / 1024)) kB with the default cache, $((unbounded / 1024)) kB caching them all"
[ "$bounded" -lt "$LIMIT" ] || fail "a session that touched $N counters holds $bounded bytes (limit $LIMIT)"
[ "$unbounded" -gt "$bounded" ] || fail "caching every counter took no more memory: the test measures nothing"
total=$(q -c "SELECT sum(counter_value('m' || g)) FROM generate_series(1, $N) g")
[ "$total" = $((3 * N)) ] || fail "the $N counters add up to $total, want $((3 * N))"
echo "RESULT the $N counters add up to $total"

# eviction in the middle of a transaction's increments
q >/dev/null <<'SQL'
SET sharded_seq.session_cache_size = 16;
BEGIN;
SELECT count(counter_incr('e' || (g % 1000), 1)) FROM generate_series(0, 2999) g;
SAVEPOINT s;
SELECT count(counter_incr('e' || g, 100)) FROM generate_series(0, 499) g;
ROLLBACK TO s;
SELECT count(counter_incr('e' || g, 2)) FROM generate_series(0, 999, 2) g;
COMMIT;
SQL
bad=$(q -c "SELECT count(*) FROM generate_series(0, 999) g
             WHERE counter_value('e' || g) <> CASE WHEN g % 2 = 0 THEN 5 ELSE 3 END")
[ "$bad" = 0 ] || fail "$bad of 1000 counters lost or gained increments through eviction"
echo "RESULT 1000 counters incremented through a 16-entry cache, with a rolled-back savepoint: all exact"

# sequences through the same cache
q -c "SELECT count(sharded_seq.create_sequence('s' || g, shards => 2, block => 3)) FROM generate_series(1, 40) g" >/dev/null
q >"$WORK/seq.out" <<'SQL'
SET sharded_seq.session_cache_size = 16;
CREATE TEMP TABLE drawn (seq int, round int, v bigint, cur bigint);
DO $$
BEGIN
    FOR r IN 1 .. 10 LOOP
        FOR s IN 1 .. 40 LOOP
            INSERT INTO drawn SELECT s, r, sharded_nextval('s' || s), sharded_currval('s' || s);
        END LOOP;
    END LOOP;
END $$;
SELECT count(*) FILTER (WHERE v <> cur),
       count(*) FILTER (WHERE v <= (SELECT max(d2.v) FROM drawn d2 WHERE d2.seq = d.seq AND d2.round < d.round)),
       count(DISTINCT (seq, v))
  FROM drawn d;
SQL
read -r wrong_cur backwards distinct < <(tail -1 "$WORK/seq.out" | tr '|' ' ')
echo "RESULT 400 values from 40 sequences through a 16-entry cache: currval wrong $wrong_cur, not increasing $backwards, distinct $distinct"
[ "$wrong_cur" = 0 ] && [ "$backwards" = 0 ] && [ "$distinct" = 400 ] || fail "sequences misbehaved through eviction"

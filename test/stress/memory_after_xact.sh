#!/usr/bin/env bash
# E5 after one large transaction: whatever a transaction did, once it has
# ended the session's memory is back under the bound, as if it had done the
# same work in small transactions (a pooled connection that ran one bulk job
# must not keep that job's memory).  Library preloaded (the issue's setting).
# Each case runs in a session of its own, which then reads its own memory in
# pg_backend_memory_contexts:
#   - the whole session under 16 MB, and at most 1 MB above a session that
#     did the same 100,000 counters in 100 transactions;
#   - TopMemoryContext under 1 MB (nothing of ours is left there);
#   - the extension's contexts other than its bounded caches under 1 MB.
# In the 'memcached' cases, what PostgreSQL's lock manager itself keeps after
# a transaction that held as many locks (measured) is set aside first.
# Cases: 100,000 new counters in one statement; the same, rolled back; 1,000
# savepoints, every other one rolled back; 100,000 'buffered' counters
# committed and then flushed in one transaction each; 20,000 'memcached'
# counters committed, flushed, and committed while memcached is down (the
# amounts wait as leftovers, one of them while its rows are held).  Totals
# are checked after each.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_memxact.XXXXXX)"
chmod 755 "$WORK"
trap 'for s in ${!SESSION_FD_*}; do session_close "${s#SESSION_FD_}"; done; memcached_kill;
      cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
MCPORT="$(free_port)"
memcached_start "$MCPORT"
cluster_create "$WORK/pg"
cat >>"$PGDATA/postgresql.conf" <<CONF
shared_preload_libraries = 'sharded_seq'
sharded_seq.buffered_slots = 262144
sharded_seq.memcached_servers = '127.0.0.1:$MCPORT'
# each commit sends its own 'memcached' amounts; the worker flushes nothing
# by itself while the test runs
sharded_seq.memcached_batch_delay = 0
sharded_seq.counter_flush_interval = 3600
# a commit locks each 'memcached' counter it adds to: 20,000 in one transaction
max_locks_per_transaction = 1024
CONF
cluster_start
db_create stress
q() { psql -qXAt -v ON_ERROR_STOP=1 -d stress "$@"; }
fail() { echo "FAILED: $*"; exit 1; }
N=100000
M=20000
LIMIT_KB=$((16 * 1024))

# The session's memory in kB: all of it, TopMemoryContext, and the
# extension's contexts but for its caches (bounded by session_cache_size);
# then, to show what a failure is made of, the contexts over 256 kB.
MEASURE="SELECT 'memory', sum(total_bytes)::bigint / 1024,
       coalesce(sum(total_bytes) FILTER (WHERE name = 'TopMemoryContext'), 0)::bigint / 1024,
       coalesce(sum(total_bytes) FILTER (
           WHERE coalesce(ident, name) LIKE 'sharded\\_seq%'
             AND coalesce(ident, name) NOT IN ('sharded_seq counters', 'sharded_seq sequences',
                                               'sharded_seq cache entries')), 0)::bigint / 1024
  FROM pg_backend_memory_contexts;
SELECT 'context', coalesce(ident, name), sum(total_bytes)::bigint / 1024
  FROM pg_backend_memory_contexts GROUP BY 2 HAVING sum(total_bytes) > 256 * 1024 ORDER BY 3 DESC;"
# in_session NAME: run stdin in one session, then read that session's
# memory into $WORK/NAME.out
in_session() {
    { cat; echo ";"; echo "$MEASURE"; } | q >"$WORK/$1.out" 2>&1 || { cat "$WORK/$1.out"; fail "$1: the session failed"; }
}
memory_of() { grep '^memory|' "$WORK/$1.out" | tail -1 | cut -d'|' -f2-; }

# the steady state: the same counters, 1,000 per transaction
q -c "SELECT count(counter_incr('obj/' || g, 0)) FROM generate_series(1, $N) g" >/dev/null
in_session steady <<SQL
DO \$\$ BEGIN
    FOR i IN 0 .. 99 LOOP
        PERFORM counter_incr('obj/' || g, 0) FROM generate_series(i * 1000 + 1, i * 1000 + 1000) g;
        COMMIT;
    END LOOP;
END \$\$
SQL
IFS='|' read -r base _ _ <<<"$(memory_of steady)"
echo "RESULT a session that incremented $N counters in 100 transactions holds $base kB"
[ "$base" -lt "$LIMIT_KB" ] || fail "the steady state itself is over 16 MB: $base kB"

bad=0
check() {  # check CASE NAME [TOTAL_KB TOP_KB]: the memory session NAME was left with, less what PostgreSQL itself keeps
    local total top ours pg_total="${3:-0}" pg_top="${4:-0}"
    IFS='|' read -r total top ours <<<"$(memory_of "$2")"
    echo "RESULT after $1: $total kB in all (steady state $base kB), TopMemoryContext $top kB, sharded_seq outside its caches $ours kB${3:+ (PostgreSQL itself keeps $pg_total kB after as many locks, $pg_top kB of it in TopMemoryContext)}"
    total=$((total - pg_total))
    top=$((top - pg_top))
    local before=$bad
    [ "$total" -lt "$LIMIT_KB" ] || { echo "FAILED: after $1 the session holds $total kB, over the 16 MB of E5"; bad=1; }
    [ "$total" -le $((base + 1024)) ] || { echo "FAILED: after $1 the session holds $total kB, more than 1 MB above the steady state"; bad=1; }
    [ "$top" -lt 1024 ] || { echo "FAILED: after $1 TopMemoryContext holds $top kB"; bad=1; }
    [ "$ours" -lt 1024 ] || { echo "FAILED: after $1 the extension's own contexts hold $ours kB besides its caches"; bad=1; }
    [ "$bad" = "$before" ] || grep '^context|' "$WORK/$2.out" | sed 's/^/    /'
}

in_session bulk <<SQL
SELECT count(counter_incr('new/' || g)) FROM generate_series(1, $N) g
SQL
check "$N new counters in one statement" bulk
in_session rollback <<SQL
BEGIN;
SELECT count(counter_incr('new/' || g, 5)) FROM generate_series(1, $N) g;
ROLLBACK
SQL
check "$N increments rolled back" rollback
in_session savepoints <<SQL
DO \$\$ BEGIN
    FOR i IN 1 .. 1000 LOOP
        BEGIN
            PERFORM counter_incr('new/' || g) FROM generate_series(i * 100 - 99, i * 100) g;
            IF i % 2 = 0 THEN RAISE EXCEPTION 'undo'; END IF;
        EXCEPTION WHEN raise_exception THEN NULL;
        END;
    END LOOP;
END \$\$
SQL
check "1,000 savepoints, half rolled back" savepoints
got=$(q -c "SELECT sum(counter_value('new/' || g)) FROM generate_series(1, $N) g")
[ "$got" = $((N + N / 2)) ] || fail "the new counters add up to $got, want $((N + N / 2))"
echo "RESULT the $N new counters add up to $got"

worker_settled stress
q -c "SELECT count(sharded_seq.create_counter('buf/' || g, 1, 'buffered')) FROM generate_series(1, $N) g" >/dev/null
in_session buffered <<SQL
SELECT count(counter_incr('buf/' || g)) FROM generate_series(1, $N) g
SQL
check "$N buffered counters committed" buffered
slots=$(q -c "SELECT used FROM sharded_seq.buffered_slots()")
[ "$slots" -ge "$N" ] || fail "only $slots slots in use: the buffered case measures nothing"
in_session flush <<SQL
SELECT sharded_seq.flush_counters()
SQL
check "flushing $N buffered counters" flush
got=$(q -c "SELECT sum(counter_value('buf/' || g)) FROM generate_series(1, $N) g")
[ "$got" = "$N" ] || fail "the buffered counters add up to $got, want $N"
echo "RESULT the $N buffered counters add up to $got"

# A commit locks each 'memcached' counter it adds to, and a flush each
# counter it moves.  PostgreSQL's lock manager keeps memory after a
# transaction that held many locks (each lock's owner array, freed into
# TopMemoryContext, and the LOCALLOCK hash): that much is not ours.
in_session fresh <<<"SELECT 1"
in_session locks <<SQL
SELECT count(pg_advisory_xact_lock(g)) FROM generate_series(1, $M) g
SQL
IFS='|' read -r fresh_total fresh_top _ <<<"$(memory_of fresh)"
IFS='|' read -r locks_total locks_top _ <<<"$(memory_of locks)"
locks_total=$((locks_total - fresh_total))
locks_top=$((locks_top - fresh_top))
q -c "SELECT count(sharded_seq.create_counter('mc/' || g, 1, 'memcached')) FROM generate_series(1, $M) g" >/dev/null
in_session memcached <<SQL
SELECT count(counter_incr('mc/' || g)) FROM generate_series(1, $M) g
SQL
check "$M memcached counters committed" memcached "$locks_total" "$locks_top"
in_session mcflush <<SQL
SELECT sharded_seq.flush_counters()
SQL
check "flushing $M memcached counters" mcflush "$locks_total" "$locks_top"
# memcached goes away: one commit leaves every amount as a leftover of its
# session, the next commit writes them to the rows but one, whose rows
# another session holds; that one waits for a later commit
memcached_kill
holder=$(q -c "SELECT id FROM sharded_seq.counter_config WHERE name = 'mc/1'")
session_open holder
session_send holder "BEGIN; SELECT 1 FROM sharded_seq.counter_shards WHERE counter_id = $holder FOR UPDATE;"
session_sync holder
session_open lo
session_send lo "SELECT count(counter_incr('mc/' || g)) FROM generate_series(1, $M) g;"
session_send lo "SELECT counter_incr('new/1', 0);"
session_send lo "$MEASURE"
session_sync lo
check "$M memcached amounts left over, then written but one" lo "$locks_total" "$locks_top"
waiting=$(q -c "SELECT sum(counter_value('mc/' || g)) FROM generate_series(1, $M) g")
session_send holder "COMMIT;"
session_close holder
session_send lo "SELECT counter_incr('new/1', 0);"
session_sync lo
session_close lo
[ -z "$(session_errors holder)$(session_errors lo)" ] || fail "a session failed: $(cat "$WORK/holder.err" "$WORK/lo.err")"
got=$(q -c "SELECT sum(counter_value('mc/' || g)) FROM generate_series(1, $M) g")
echo "RESULT with memcached down, the $M memcached counters add up to $waiting in the rows while one leftover waits, then $got"
[ "$waiting" = $((2 * M - 1)) ] && [ "$got" = $((2 * M)) ] || fail "the memcached counters add up to $waiting, then $got; want $((2 * M - 1)), then $((2 * M))"
[ "$bad" = 0 ] || exit 1

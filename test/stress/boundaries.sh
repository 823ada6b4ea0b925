#!/usr/bin/env bash
# Transaction boundaries that pgTAP cannot reach: a real memcached (and a
# proxy that holds its SET replies), statements ordered across sessions that
# end their own transactions, and tables that VACUUM FULL really shrinks.
#   1. VACUUM FULL and CLUSTER move rows a transaction remembered (commit works).
#   2. mode 'memcached': nothing reaches memcached unless the commit is final
#      (a later pre-commit failure, SERIALIZABLE at commit, ROLLBACK PREPARED);
#      flushes in rolled-back savepoints give back; PREPARE after a flush is
#      refused; flush_counters() needs rights; alter to 'exact' strands nothing.
#   3. a lease published with a timed-out set is never used outside memcached.
#   4. DROP and CREATE EXTENSION: no memcached key of the old install is read.
#   5. first commits to fresh memcached counters race: nothing dropped, and
#      the shared statistics never leave their lock held.
#   6. memcached gone between a commit's decision and its delivery: the
#      amount goes to the rows with the next commit, or at backend exit.
#   7. such amounts never make another commit wait or fail: a second one of
#      the same counter while its rows are held, a table lock, SERIALIZABLE,
#      DROP EXTENSION in the committing transaction.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_bound.XXXXXX)"
chmod 755 "$WORK"
PROXY_PID=""
trap '[ -n "$PROXY_PID" ] && kill $PROXY_PID 2>/dev/null; memcached_kill KILL; cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
MC_PORT="$(free_port)"
PROXY_PORT="$(free_port)"
memcached_start "$MC_PORT"
cluster_create "$WORK/pg"
cat >>"$PGDATA/postgresql.conf" <<CONF
shared_preload_libraries = 'sharded_seq'
sharded_seq.memcached_servers = '127.0.0.1:$MC_PORT'
sharded_seq.counter_flush_interval = 3600
CONF
cluster_start
db_create stress
# its first round flushes memcached counters; after it, an hour goes by
worker_settled stress

fail() { echo "FAILED: $*"; exit 1; }
ok() { echo "RESULT ok: $*"; }
q() { psql -qXAt -d "${DB:-stress}" -c "$1"; }
expect() {  # expect DESCRIPTION ACTUAL WANTED
    [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"
    ok "$1 ($2)"
}
errors_of() { session_errors "$1" | tr '\n' ' ' | sed 's/ $//'; }
# ONLY="2 4" runs just those parts (each part stands alone)
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }

if want 1; then
echo "== 1. VACUUM FULL and CLUSTER under a transaction that remembered rows"
for how in "VACUUM FULL sharded_seq.counter_shards" \
           "CLUSTER sharded_seq.counter_shards USING counter_shards_pkey"; do
    q "SELECT count(sharded_seq.create_counter('filler_' || g, shards => 16)) FROM generate_series(1, 300) g" >/dev/null
    q "SELECT sharded_seq.create_counter('far', shards => 2)" >/dev/null
    q "SELECT count(sharded_seq.drop_counter('filler_' || g)) FROM generate_series(1, 300) g" >/dev/null
    before=$(q "SELECT pg_relation_size('sharded_seq.counter_shards') / 8192")
    session_open A
    session_send A "BEGIN; SELECT counter_incr('far', 2);"
    session_sync A
    q "$how"
    after=$(q "SELECT pg_relation_size('sharded_seq.counter_shards') / 8192")
    [ "$after" -lt "$before" ] || fail "$how did not shrink the table ($before -> $after pages): test is void"
    session_send A "COMMIT;"
    session_sync A
    session_close A
    expect "${how%% *} shrank the table ($before -> $after pages), then the commit: errors" "$(errors_of A)" ""
    expect "... and the increment counts" "$(q "SELECT counter_value('far')")" 2
    q "SELECT sharded_seq.drop_counter('far')" >/dev/null
done
fi

if want 2; then
echo "== 2. write-behind through memcached at transaction boundaries"
q "SELECT sharded_seq.create_counter('bA', shards => 4, mode => 'memcached')" >/dev/null
for _ in 1 2 3; do q "SELECT counter_incr('bA', 10)" >/dev/null; done
total() { q "SELECT counter_value('bA')"; }
pending() { q "SELECT pending FROM sharded_seq.counters WHERE name = 'bA'"; }
expect "three committed increments count" "$(total)" 30
P0=$(pending)
[ "$P0" -gt 0 ] || fail "nothing waits in memcached: test is void"

# a pre-commit step after the memcached increment fails
q "SELECT sharded_seq.create_counter('eVictim')" >/dev/null
session_open A
session_send A "BEGIN; SELECT counter_incr('bA', 5); SELECT counter_incr('eVictim', 1);"
session_sync A
q "SELECT sharded_seq.drop_counter('eVictim')" >/dev/null
session_send A "COMMIT;"
session_sync A
expect "a commit that fails after its memcached increment was applied: error" "$(errors_of A)" 42704
expect "... and the memcached increment does not count" "$(total)" 30

# SERIALIZABLE: the commit fails after the pre-commit callbacks
q "CREATE TABLE skew (k int PRIMARY KEY, v int); INSERT INTO skew VALUES (1, 0), (2, 0)"
session_open B
session_send A "BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT sum(v) FROM skew; UPDATE skew SET v = 1 WHERE k = 1;"
session_send B "BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT sum(v) FROM skew; UPDATE skew SET v = 1 WHERE k = 2; SELECT counter_incr('bA', 5);"
session_sync A; session_sync B
session_send A "COMMIT;"; session_sync A
session_send B "COMMIT;"; session_sync B
expect "write skew: the second SERIALIZABLE commit fails" "$(errors_of B)" 40001
expect "... and its memcached increment does not count" "$(total)" 30

# two-phase commit
session_send A "BEGIN; SELECT counter_incr('bA', 7); PREPARE TRANSACTION 'bp1';"
session_sync A
q "ROLLBACK PREPARED 'bp1'"
expect "ROLLBACK PREPARED: the memcached increment does not count" "$(total)" 30
session_send A "BEGIN; SELECT counter_incr('bA', 7); PREPARE TRANSACTION 'bp2';"
session_sync A
q "COMMIT PREPARED 'bp2'"
expect "COMMIT PREPARED: it counts, once" "$(total)" 37

# flushes that are undone give back what they took
session_send A "BEGIN; SAVEPOINT s; SELECT sharded_seq.flush_counters(); ROLLBACK TO SAVEPOINT s; COMMIT;"
session_sync A
expect "a flush in a rolled-back savepoint loses nothing" "$(total)" 37
expect "... the amount is back in memcached" "$(pending)" "$P0"
before_errors="$(errors_of A)"
session_send A "BEGIN; SELECT sharded_seq.flush_counters(); PREPARE TRANSACTION 'bp3';"
session_sync A
[ "$(errors_of A)" = "$(echo $before_errors 0A000)" ] || {
    q "ROLLBACK PREPARED 'bp3'" >/dev/null 2>&1 || true
    fail "PREPARE after a flush was not refused (errors: $(errors_of A))"
}
ok "PREPARE after a flush is refused with 0A000"
expect "... and nothing is lost" "$(total)" 37

# flush_counters needs the right to increment
q "CREATE ROLE thief LOGIN"
flushed=$(psql -qXAt -U thief -d stress -c "BEGIN" -c "SAVEPOINT s" -c "SELECT sharded_seq.flush_counters()" -c "ROLLBACK TO SAVEPOINT s" -c "COMMIT" | head -1)
expect "a role without rights on a counter flushes nothing" "$flushed" 0
expect "... and takes nothing from it" "$(total)" 37
expect "... whose amount still waits in memcached" "$(pending)" "$P0"

# a flush locks only counters that have an amount to move
q "SELECT count(sharded_seq.create_counter('quiet_' || g)) FROM generate_series(1, 300) g" >/dev/null
expect "flush_counters() over 300 quiet counters and one with an amount: advisory locks held" \
    "$(psql -qXAt -d stress -c "BEGIN" -c "SELECT sharded_seq.flush_counters()" \
        -c "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()" -c "ROLLBACK" | tail -1)" 1

# a transaction that incremented while in mode memcached commits after alter to exact
session_send A "BEGIN; SELECT counter_incr('bA', 3);"
session_sync A
q "SELECT sharded_seq.alter_counter('bA', mode => 'exact')" >/dev/null
session_send A "COMMIT;"
session_sync A
session_close A; session_close B
expect "an increment made while in mode memcached and committed after alter to exact counts" "$(total)" 40
# back in mode memcached, an amount stranded in memcached would count again
# (batched, the commit's amount waits in shared memory for the rows: no flush
# here, which would take a stranded amount out of memcached too)
q "SELECT sharded_seq.alter_counter('bA', mode => 'memcached')" >/dev/null
expect "... and nothing is stranded in memcached: back in mode memcached it" "$(total)" 40
fi

if want 3; then
echo "== 3. a lease whose publication timed out"
# No step depends on the machine's speed.  The proxy holds every SET reply
# for good (memcached has applied the SET), so a SET through it times out
# however long the timeout; every other reply it forwards, and sessions A and
# B wait 5 s for those, which no load delays.  Each step waits on what the
# proxy reports or on a session's answer, never on a delay.
python3 "$HERE/mcproxy.py" "$PROXY_PORT" "$MC_PORT" never 1 >"$WORK/proxy.log" 2>&1 &
PROXY_PID=$!
proxy_said() {  # proxy_said PATTERN WHAT: wait (30 s at most) for a line of the proxy
    for _ in $(seq 1 300); do
        grep -q "$1" "$WORK/proxy.log" && return 0
        sleep 0.1
    done
    fail "$2"
}
proxy_said '^listening' "the proxy did not start within 30 s"
q "SELECT sharded_seq.create_sequence('mp', tier => 'memcached', block => 300)" >/dev/null
mp_stat() { q "SELECT $1 FROM sharded_seq.memcached_stats WHERE name = 'mp'"; }
patient="SET sharded_seq.memcached_servers = '127.0.0.1:$PROXY_PORT'; SET sharded_seq.memcached_poll_timeout = '5s';"
# A finds no lease, carves one and publishes it: memcached stores the SET,
# A sees a timeout.  A must then take values of that lease only through
# memcached's counter (or fall back to a block of its own), never directly.
session_open A
session_send A "$patient"
session_send A "SELECT sharded_nextval('mp');"
session_sync A
proxy_said '^held 1$' "A's lease publication (a SET) never reached memcached"
expect "the first draw published a lease whose SET timed out: errors >= 1" "$(mp_stat 'errors >= 1')" t
# B finds the published lease and draws from it through memcached: had A
# used the lease directly, B's values would repeat A's.
session_open B
session_send B "$patient"
session_send B "SELECT sharded_nextval('mp') FROM generate_series(1, 30);"
session_sync B
expect "another session drew from that lease through memcached: hits >= 10" "$(mp_stat 'hits >= 10')" t
python3 "$HERE/check_values.py" "$WORK"/A.out "$WORK"/B.out || fail "A and B drew the same values"
session_close A; session_close B
# Then a load: 4 sessions with the default 200 ms timeout, whose SETs all
# time out while others draw.  Which path each draw takes depends on the
# machine (a busy proxy may time out other replies too); nothing here
# asserts one: whatever times out, no value may repeat (S1) nor go back (S2).
gen() {
    echo "SET sharded_seq.memcached_servers = '127.0.0.1:$PROXY_PORT';"
    for _ in $(seq 1 150); do echo "SELECT sharded_nextval('mp') FROM generate_series(1, 20);"; done
}
run_sessions stress mp 4 gen
wait_sessions
kill $PROXY_PID 2>/dev/null || true; PROXY_PID=""
cat "$WORK"/mp.*.err "$WORK"/A.err "$WORK"/B.err | grep . && fail "a session saw an error"
python3 "$HERE/check_values.py" "$WORK"/mp.*.out "$WORK"/A.out "$WORK"/B.out
[ "$(cat "$WORK"/mp.*.out | wc -l)" = 12000 ] || fail "not every draw returned a value"
ok "12000 values drawn while every lease publication timed out ($(mp_stat "'hits ' || hits || ', errors ' || errors || ', fallbacks ' || fallbacks"))"
fi

if want 4; then
echo "== 4. DROP and CREATE EXTENSION with keys of the old install in memcached"
psql -qX -d postgres -c "CREATE DATABASE reinstall" >/dev/null
DB=reinstall q "CREATE EXTENSION sharded_seq"
worker_settled reinstall
setup_objects() {
    DB=reinstall q "SELECT sharded_seq.create_sequence('ms', tier => 'memcached', block => 200)" >/dev/null
    DB=reinstall q "SELECT sharded_seq.create_counter('bc', mode => 'memcached')" >/dev/null
}
setup_objects
DB=reinstall q "SELECT sharded_nextval('ms') FROM generate_series(1, 100)" >"$WORK/old.out"
DB=reinstall q "SELECT counter_incr('bc', 1)" >/dev/null
DB=reinstall q "SELECT counter_incr('bc', 41)" >/dev/null
# the worker forwards the amounts to memcached in batches: a read while a
# batch is in transit misses it for a moment (C2), so wait until it lands
for _ in $(seq 1 200); do
    [ "$(DB=reinstall q "SELECT coalesce(pending, 0) FROM sharded_seq.counters")" -gt 0 ] && break
    sleep 0.05
done
[ "$(DB=reinstall q "SELECT coalesce(pending, 0) FROM sharded_seq.counters")" -gt 0 ] || fail "nothing waits in memcached: test is void"
DB=reinstall q "DROP EXTENSION sharded_seq CASCADE; CREATE EXTENSION sharded_seq"
setup_objects
DB=reinstall q "SELECT sharded_nextval('ms') FROM generate_series(1, 150)" >"$WORK/new.1.out"
DB=reinstall q "SELECT sharded_nextval('ms') FROM generate_series(1, 150)" >"$WORK/new.2.out"
python3 "$HERE/check_values.py" "$WORK"/new.*.out
expect "the new install's counter starts at zero" "$(DB=reinstall q "SELECT counter_value('bc')")" 0

# the same, when both installations came through version 1.0 and an update
psql -qX -d postgres -c "CREATE DATABASE via10" >/dev/null
DB=via10 q "CREATE EXTENSION sharded_seq VERSION '1.0'"
DB=via10 q "SELECT sharded_seq.create_sequence('ms', tier => 'memcached', block => 1000)" >/dev/null
DB=via10 q "SELECT sharded_nextval('ms') FROM generate_series(1, 5)" >/dev/null
DB=via10 q "DROP EXTENSION sharded_seq CASCADE; CREATE EXTENSION sharded_seq VERSION '1.0'; ALTER EXTENSION sharded_seq UPDATE"
expect "an update from 1.0 with nothing in memcached draws a token of its own" "$(DB=via10 q "SELECT token <> 0 FROM sharded_seq.installation")" t
DB=via10 q "SELECT sharded_seq.create_sequence('ms2', tier => 'memcached', block => 1000)" >/dev/null
DB=via10 q "SELECT sharded_nextval('ms2') FROM generate_series(1, 5)" >"$WORK/via10.1.out"
psql -qXAt -d via10 -c "SET sharded_seq.memcached_servers = '127.0.0.1:$(free_port)'" \
    -c "SELECT sharded_nextval('ms2') FROM generate_series(1, 20)" >"$WORK/via10.2.out"
python3 "$HERE/check_values.py" "$WORK"/via10.*.out
fi

if want 5; then
echo "== 5. first commits to fresh memcached counters, all at once, with shared statistics"
# Each of 8 sessions commits its increment of counter k the moment D lets go
# of lock k, so that first commits (and first statistics events) collide.
N=150
q "SELECT count(sharded_seq.create_counter('r_' || g, shards => 2, mode => 'memcached')) FROM generate_series(1, $N) g" >/dev/null
session_open D
session_send D "SELECT count(pg_advisory_lock(g)) FROM generate_series(1, $N) g;"
session_sync D
race() {
    local k
    for k in $(seq 1 $N); do
        echo "BEGIN; SELECT counter_incr('r_$k'); SELECT pg_advisory_xact_lock_shared($k); COMMIT;"
    done
}
run_sessions stress race 8 race
for k in $(seq 1 $N); do
    waiting=0
    for _ in $(seq 1 100); do
        waiting=$(q "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $k AND NOT granted")
        [ "$waiting" = 8 ] && break
        sleep 0.05
    done
    # sessions that stop arriving are stuck on a lock left held
    [ "$waiting" = 8 ] || fail "round $k: only $waiting of 8 sessions reached it within 5 s: a lock was left held"
    session_send D "SELECT pg_advisory_unlock($k);"
done
session_sync D
session_close D
for _ in $(seq 1 600); do sessions_running || break; sleep 0.1; done
sessions_running && fail "sessions still running 60 s after the last release: a lock was left held"
cat "$WORK"/race.*.err | grep . && fail "a session saw an error"
expect "no session hung, and the statistics can be read" \
    "$(timeout 30 psql -qXAt -d stress -c "SELECT count(*) > 0 FROM sharded_seq.memcached_stats")" t
# an increment reaches memcached a moment after its commit returned (it is
# sent without waiting for a reply): give the last ones that moment
for _ in $(seq 1 50); do
    [ "$(q "SELECT sum(counter_value('r_' || g)) FROM generate_series(1, $N) g")" = $((8 * N)) ] && break
    sleep 0.1
done
expect "8 sessions x $N fresh counters, committed at once: every increment counts" \
    "$(q "SELECT sum(counter_value('r_' || g)) FROM generate_series(1, $N) g")" $((8 * N))
q "SELECT sharded_seq.flush_counters()" >/dev/null
expect "... and still after a flush to the rows" \
    "$(q "SELECT sum(counter_value('r_' || g)) || ' ' || sum(pending) FROM generate_series(1, $N) g, sharded_seq.counters c WHERE c.name = 'r_' || g")" "$((8 * N)) 0"
fi

if want 6; then
echo "== 6. memcached gone after the commit decided to use it"
DEAD_PORT="$(free_port)"    # nothing listens there: the first commit finds it down only after committing
q "SELECT sharded_seq.create_counter('lb', mode => 'memcached')" >/dev/null
session_open L
session_send L "SET sharded_seq.memcached_servers = '127.0.0.1:$DEAD_PORT';"
# the read inside counter_incr finds memcached down; a second later the
# commit no longer knows it, chooses memcached, and finds it down after commit
leftover() { session_send L "BEGIN; SELECT counter_incr('lb', $1); SELECT pg_sleep(1.2); COMMIT;"; }
leftover 5
session_send L "SELECT 'seen here: ' || counter_value('lb');"
session_sync L
expect "an amount that found memcached gone after its commit is not in the rows yet" "$(q "SELECT counter_value('lb')")" 0
expect "... but the committing session counts it" "$(grep -c '^seen here: 5$' "$WORK/L.out")" 1
session_send L "SELECT counter_incr('lb', 7);"
session_sync L
expect "its next commit writes the rows, with the earlier amount" "$(q "SELECT counter_value('lb')")" 12
leftover 3
session_sync L
expect "another amount left over" "$(q "SELECT counter_value('lb')")" 12
q "SELECT sharded_seq.alter_counter('lb', mode => 'exact')" >/dev/null
session_close L
expect "an amount left when the session ends is written to the rows at exit, after a switch to exact" \
    "$(q "SELECT counter_value('lb')")" 15
expect "... with nothing in memcached, and no error" "$(q "SELECT sharded_seq.counter_pending(id) FROM sharded_seq.counter_config WHERE name = 'lb'") $(errors_of L)" "0 "

# a leftover never holds up or fails another commit: not when its rows are
# held by another transaction, not when its counter cannot take it
q "SELECT sharded_seq.create_counter('held', shards => 1, mode => 'memcached'), sharded_seq.create_counter('full', shards => 1, mode => 'memcached'), sharded_seq.create_counter('other')" >/dev/null
session_open L
session_send L "SET sharded_seq.memcached_servers = '127.0.0.1:$DEAD_PORT'; SET lock_timeout = '3s';"
# (one counter a transaction: the first delivery attempt tells the second that memcached is down)
session_send L "BEGIN; SELECT counter_incr('held', 5); SELECT pg_sleep(1.2); COMMIT;"
session_send L "BEGIN; SELECT counter_incr('full', 1000); SELECT pg_sleep(1.2); COMMIT;"
session_sync L
q "SELECT counter_incr('full', 9223372036854775000)" >/dev/null
session_open H
session_send H "BEGIN; UPDATE sharded_seq.counter_shards SET value = value WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = 'held');"
session_sync H
session_send L "SELECT counter_incr('other', 1);"
session_sync L
expect "a commit whose leftovers' rows are held, or cannot take them, neither waits nor fails" "$(errors_of L)" ""
expect "... and counts its own increment" "$(q "SELECT counter_value('other')")" 1
session_send H "ROLLBACK;"
session_sync H
session_send L "SELECT counter_incr('other', 1);"
session_sync L
expect "the held leftover goes to the rows with a later commit" "$(q "SELECT counter_value('held')")" 5
expect "... and the one that cannot fit is dropped, not retried forever" "$(q "SELECT counter_value('full')") $(errors_of L)" "9223372036854775000 "
# exit does not wait long for held rows
session_send L "BEGIN; SELECT counter_incr('held', 4); SELECT pg_sleep(1.2); COMMIT;"
session_sync L
session_send H "BEGIN; UPDATE sharded_seq.counter_shards SET value = value WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = 'held');"
session_sync H
session_close L
for _ in $(seq 1 100); do
    [ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'L'")" = 0 ] && break
    sleep 0.1
done
expect "a session whose leftover's rows are held still exits (within 10 s; it gives up after about one)" \
    "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'L'")" 0
session_send H "ROLLBACK;"
session_close H

# a leftover never reaches a counter of a later installation
psql -qX -d postgres -c "CREATE DATABASE leftover" >/dev/null
DB=leftover q "CREATE EXTENSION sharded_seq"
DB=leftover q "SELECT sharded_seq.create_counter('old_c', mode => 'memcached')" >/dev/null
session_open M leftover
session_send M "SET sharded_seq.memcached_servers = '127.0.0.1:$DEAD_PORT';"
session_send M "BEGIN; SELECT counter_incr('old_c', 5); SELECT pg_sleep(1.2); COMMIT;"
session_sync M
DB=leftover q "DROP EXTENSION sharded_seq CASCADE; CREATE EXTENSION sharded_seq"
DB=leftover q "SELECT sharded_seq.create_counter('victim')" >/dev/null
expect "the new installation's counter with the same id" "$(DB=leftover q "SELECT id FROM sharded_seq.counter_config WHERE name = 'victim'")" 1
session_send M "SELECT 'victim seen here: ' || counter_value('victim');"
session_send M "SELECT pg_sleep(1.2); SELECT counter_incr('mine', 1);"
session_sync M
session_close M
expect "... is not given the old installation's leftover, in that session" "$(grep -c '^victim seen here: 0$' "$WORK/M.out")" 1
expect "... nor in its rows, after a commit and the session's exit" "$(DB=leftover q "SELECT counter_value('victim')")" 0
fi

if want 7; then
echo "== 7. amounts left over never make another commit wait or fail"
DEAD_PORT="$(free_port)"
q "SELECT sharded_seq.create_counter('c1', shards => 1, mode => 'memcached'), sharded_seq.create_counter('e1', shards => 1)" >/dev/null
q "CREATE TABLE y (i int)"
left_over() { session_send "$1" "BEGIN; SELECT counter_incr('$2', $3); SELECT pg_sleep(1.2); COMMIT;"; }
session_open S
session_send S "SET sharded_seq.memcached_servers = '127.0.0.1:$DEAD_PORT'; SET lock_timeout = '3s';"
left_over S c1 5
session_sync S
session_open H
session_send H "BEGIN; SELECT 1 FROM sharded_seq.counter_shards WHERE counter_id = (SELECT id FROM sharded_seq.counter_config WHERE name = 'c1') FOR UPDATE;"
session_sync H
left_over S c1 7        # its commit finds the first one's rows held
session_sync S
session_send H "COMMIT;"; session_sync H
session_send S "SELECT pg_sleep(1.2); SELECT counter_incr('e1', 1);"
session_sync S
expect "two amounts of one counter left over while its rows were held both count" "$(q "SELECT counter_value('c1')")" 12
left_over S c1 1
session_sync S
session_send H "BEGIN; LOCK TABLE sharded_seq.counter_shards IN SHARE MODE;"
session_sync H
session_send S "SELECT pg_sleep(1.2); SELECT counter_incr('c1', 0), counter_incr('e1', 0);"
session_sync S
expect "a commit with a leftover does not wait for a table lock on the shard rows" "$(errors_of S)" ""
session_send H "COMMIT;"; session_sync H
left_over S c1 2
session_sync S
session_send H "BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT counter_value('c1'); INSERT INTO y VALUES (1);"
session_sync H
session_send S "SELECT pg_sleep(1.2); BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT count(*) FROM y; SELECT counter_incr('e1', 1);"
session_sync S
session_send H "COMMIT;"; session_sync H
session_send S "COMMIT;"; session_sync S
expect "a SERIALIZABLE commit does not fail because of a leftover" "$(errors_of S)" ""
session_send S "SELECT counter_incr('e1', 1);"
session_sync S
expect "... which a later commit writes" "$(q "SELECT counter_value('c1') || ' ' || counter_value('e1')")" "15 3"
psql -qX -d postgres -c "CREATE DATABASE dropping" >/dev/null
DB=dropping q "CREATE EXTENSION sharded_seq"
DB=dropping q "SELECT sharded_seq.create_counter('c', mode => 'memcached'), sharded_seq.create_counter('e')" >/dev/null
session_open D dropping
session_send D "SET sharded_seq.memcached_servers = '127.0.0.1:$DEAD_PORT';"
left_over D c 5
session_send D "SELECT pg_sleep(1.2); BEGIN; SELECT counter_incr('e', 1); DROP EXTENSION sharded_seq CASCADE; COMMIT;"
session_sync D
expect "DROP EXTENSION commits in a transaction with counter work and a leftover" "$(errors_of D) $(DB=dropping q "SELECT count(*) FROM pg_extension WHERE extname = 'sharded_seq'")" " 0"
session_close D
session_close S; session_close H
for _ in $(seq 1 100); do
    [ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name IN ('S', 'D')")" = 0 ] && break
    sleep 0.1
done
expect "the sessions exit" "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name IN ('S', 'D')")" 0
expect "... and nothing was counted twice or lost" "$(q "SELECT counter_value('c1')")" 15
fi

#!/usr/bin/env bash
# Mode 'memcached' batched through shared memory (sharded_seq.memcached_batch_delay,
# C2 and P5), on a server with sharded_seq preloaded and a real memcached:
#   1. 8 sessions, a quarter of their transactions rolled back, while a reader
#      checks that no read is ever above the committed ledger and another
#      session switches the counter between modes: after flush_counters the
#      total is exact, and memcached took far fewer increments than there
#      were commits;
#   2. a commit that read the counter's mode before alter_counter left mode
#      'memcached' and commits after it: the worker's flushes count its
#      amount, which is not stranded in memcached; a commit after another
#      session dropped the counter fails (42704) in both write-behind modes;
#      flush_counters does not wait for an alter_counter; prepared
#      transactions holding other counters' rows hold nothing up: an
#      immediate shutdown loses nothing committed 2 s before;
#   3. memcached_batch_delay = 0: one memcached increment per commit again,
#      and the total is exact;
#   4. an immediate shutdown under load: the total is at most the committed
#      sum, and at least what was committed 3 s before;
#   5. memcached flush_all, then SIGKILL and a restart empty, under load: no
#      error reaches a caller, and no total is above the committed sum.
# Each committed increment also writes its delta to a ledger in the same
# transaction.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
SESSIONS=8
WORK="$(mktemp -d /tmp/ss_mcbatch.XXXXXX)"
chmod 755 "$WORK"
MC_PORT="$(free_port)"
memcached_start "$MC_PORT" >/dev/null
trap 'memcached_kill; cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
cluster_create "$WORK/pg"
cat >>"$PGDATA/postgresql.conf" <<CONF
shared_preload_libraries = 'sharded_seq'
sharded_seq.memcached_servers = '127.0.0.1:$MC_PORT'
sharded_seq.counter_flush_interval = 1
CONF
cluster_start
db_create stress
q() { psql -qXAt -v ON_ERROR_STOP=1 -d stress -c "$1"; }
fail() { echo "FAIL: $*"; exit 1; }
set_delay() { q "ALTER SYSTEM SET sharded_seq.memcached_batch_delay = '$1'" >/dev/null; q "SELECT pg_reload_conf()" >/dev/null; sleep 0.5; }
# memcached's count of increments and decrements so far
mc_incrs() { memcached_cmd "$MC_PORT" stats | awk '/STAT (incr|decr)_(hits|misses)/ {n += $3} END {print n + 0}'; }

psql -qX -v ON_ERROR_STOP=1 -d stress <<'SQL'
SELECT sharded_seq.create_counter('m', mode => 'memcached');
SELECT sharded_seq.create_counter('m4', shards => 4, mode => 'memcached');
SELECT sharded_seq.create_counter('m2', mode => 'memcached');
CREATE TABLE ledger (counter text, delta bigint, at timestamptz DEFAULT clock_timestamp());
CREATE TABLE above (read bigint, ledger bigint);
SQL
worker_settled stress || fail "no worker in database stress"

script() {  # script TRANSACTIONS PHASE SESSION: positive increments, 25% rolled back
    python3 - "$@" <<'PY'
import random, sys
n, phase, session = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
rnd = random.Random(hash((phase, session)))
out = []
for i in range(n):
    stmts = []
    for _ in range(rnd.choice([1, 1, 2])):
        d = rnd.randint(1, 9)
        name = rnd.choice(["m", "m", "m4"])
        stmts.append(f"SELECT counter_incr('{name}', {d}); INSERT INTO ledger (counter, delta) VALUES ('{name}', {d});")
    end = "ROLLBACK" if rnd.randrange(100) < 25 else "COMMIT"
    out.append("BEGIN; " + " ".join(stmts) + f" {end};")
print("\n".join(out))
PY
}
# check OP WHAT: each counter's total against its ledger, with OP (= or <=)
check() {
    psql -qX -d stress -At -F ' ' >"$WORK/check.txt" <<'SQL'
SELECT c.name, counter_value(c.name), (SELECT coalesce(sum(delta), 0) FROM ledger l WHERE l.counter = c.name)
  FROM sharded_seq.counters c WHERE c.name IN ('m', 'm4') ORDER BY 1;
SQL
    while read -r name total ledger; do
        echo "RESULT $2: counter $name total=$total ledger=$ledger"
    done <"$WORK/check.txt"
    case "$1" in
        =)  awk '$2 != $3 {bad=1} END {exit bad}' "$WORK/check.txt" || fail "$2: a total differs from the ledger" ;;
        \<=) awk '$2 > $3 {bad=1} END {exit bad}' "$WORK/check.txt" || fail "$2: a total is above the ledger" ;;
    esac
}
no_errors() {
    if grep -h "ERROR" "$WORK/$1".*.err | head -3 | grep .; then fail "$1: a caller got an error"; fi
    return 0
}
reset() {
    q "SELECT sharded_seq.flush_counters()" >/dev/null
    q "TRUNCATE ledger, above" >/dev/null
    q "UPDATE sharded_seq.counter_shards SET value = 0" >/dev/null
}

echo "== 1. batched: 8 sessions, a reader, mode switches"
reset
incr0="$(mc_incrs)"
run_sessions stress p1 $SESSIONS script 2500
# every read is of increments committed before the ledger is read after it
psql -qX -v ON_ERROR_STOP=1 -d stress >"$WORK/reader.out" 2>&1 <<'SQL' &
DO $$
DECLARE v bigint; l bigint; reads int := 0;
BEGIN
  WHILE clock_timestamp() < now() + interval '6 s' LOOP
    v := counter_value('m');
    SELECT coalesce(sum(delta), 0) INTO l FROM ledger WHERE counter = 'm';
    IF v > l THEN INSERT INTO above VALUES (v, l); END IF;
    reads := reads + 1;
  END LOOP;
  RAISE NOTICE 'reads: %', reads;
END $$;
SQL
READER=$!
switches=0
for mode in exact memcached buffered memcached exact memcached; do
    sleep 0.7
    q "SELECT sharded_seq.alter_counter('m4', mode => '$mode')" >/dev/null
    switches=$((switches + 1))
done
wait "$READER" || { cat "$WORK/reader.out"; fail "the reader failed"; }
wait_sessions
no_errors p1
sed -n 's/^NOTICE: *//p' "$WORK/reader.out"
above="$(q "SELECT count(*) FROM above")"
echo "RESULT reads above the committed ledger: $above (of the counter's reads; $switches mode switches of m4)"
[ "$above" = 0 ] || fail "a read counted an increment twice: $(q "SELECT read || ' > ' || ledger FROM above LIMIT 1")"
commits="$(q "SELECT count(*) FROM ledger")"
q "SELECT sharded_seq.flush_counters()" >/dev/null
check = "batched, after flush_counters"
incrs=$(( $(mc_incrs) - incr0 ))
echo "RESULT $commits committed increments reached memcached in $incrs requests"
[ "$commits" -gt 5000 ] || fail "too few commits: test is void"
[ $((incrs * 2)) -lt "$commits" ] || fail "memcached took about one request per commit: nothing was batched"

echo "== 2. a commit that saw mode 'memcached' after alter_counter left it"
session_open late stress
session_send late "BEGIN; SELECT counter_incr('m2', 1000); INSERT INTO ledger (counter, delta) VALUES ('m2', 1000);"
session_sync late
q "SELECT sharded_seq.alter_counter('m2', mode => 'exact')" >/dev/null
session_send late "COMMIT;"
session_sync late
session_close late
# no flush_counters: it looks in memcached whatever the mode; the worker does not
sleep 2.5
late="$(q "SELECT counter_value('m2')")"
echo "RESULT the late commit's 1000, two flush intervals after alter_counter to 'exact': counter reads $late"
[ "$late" = 1000 ] || fail "the late commit's amount went where an exact counter does not look"

# the same, but the commit lands in shared memory before alter_counter
# commits: the worker, which cannot lock the counter meanwhile, must then not
# send it to memcached
q "SELECT sharded_seq.alter_counter('m2', mode => 'memcached')" >/dev/null
session_open late stress; session_open alter stress
session_send late "BEGIN; SELECT counter_incr('m2', 1000); INSERT INTO ledger (counter, delta) VALUES ('m2', 1000);"
session_sync late
session_send alter "BEGIN; SELECT sharded_seq.alter_counter('m2', mode => 'exact');"
session_sync alter
session_send late "COMMIT;"
session_sync late
sleep 0.3
session_send alter "COMMIT;"
session_sync alter
session_close late; session_close alter
sleep 2.5
late="$(q "SELECT counter_value('m2')")"
echo "RESULT another 1000, committed while alter_counter to 'exact' was open, two flush intervals after: counter reads $late"
[ "$late" = 2000 ] || fail "an amount the worker held back during alter_counter went where an exact counter does not look"

# a commit after another session dropped the counter fails, as an exact one
# does, whichever write-behind mode; nothing waits in a slot for nobody
for mode in memcached buffered; do
    q "SELECT sharded_seq.create_counter('d', mode => '$mode')" >/dev/null
    session_open late stress
    session_send late "BEGIN; SELECT counter_incr('d', 5);"
    session_sync late
    q "SELECT sharded_seq.drop_counter('d'); SELECT sharded_seq.create_counter('d', mode => '$mode')" >/dev/null
    session_send late "COMMIT;"
    session_sync late
    session_close late
    got="$(session_errors late | tr '\n' ' ')"
    echo "RESULT mode $mode: a commit after drop_counter got errors [$got]; the new counter reads $(q "SELECT counter_value('d')")"
    [ "$got" = "42704 " ] || fail "mode $mode: a commit to a dropped counter did not fail with 42704"
    q "SELECT sharded_seq.drop_counter('d')" >/dev/null
done

# flush_counters never waits for another session's alter_counter (each
# holds one counter's lock; flushing both would deadlock)
q "SELECT sharded_seq.create_counter('fa', mode => 'memcached'), sharded_seq.create_counter('fb', mode => 'memcached')" >/dev/null
session_open s1 stress; session_open s2 stress
session_send s1 "BEGIN; SELECT sharded_seq.alter_counter('fb', mode => 'exact');"
session_send s2 "BEGIN; SELECT sharded_seq.alter_counter('fa', mode => 'exact');"
session_sync s1; session_sync s2
session_send s1 "SELECT sharded_seq.flush_counters(); COMMIT;"
session_send s2 "SELECT sharded_seq.flush_counters(); COMMIT;"
session_sync s1; session_sync s2
session_close s1; session_close s2
got="$(session_errors s1; session_errors s2)"
echo "RESULT two sessions, each altering one counter, then flush_counters: errors [$(echo $got)]"
[ -z "$got" ] || fail "flush_counters waited for an alter_counter (deadlock)"

echo "== 2b. prepared transactions hold the rows of four counters"
# the worker's flushes never wait for them, so the other counters' amounts
# neither wait in shared memory nor sit in an uncommitted flush for seconds
reset
q "CREATE TABLE ledger_h (delta int, at timestamptz DEFAULT clock_timestamp())" >/dev/null
q "SELECT sharded_seq.create_counter('h', mode => 'memcached')" >/dev/null
for i in 1 2 3 4; do
    q "SELECT sharded_seq.create_counter('p$i', shards => 1, mode => 'memcached')" >/dev/null
    q "SELECT counter_incr('p$i', 1)" >/dev/null
done
sleep 0.2
for i in 1 2 3 4; do q "BEGIN; SELECT counter_incr('p$i', 1); PREPARE TRANSACTION 'hold$i'" >/dev/null; done
for i in 1 2 3 4; do q "SELECT counter_incr('p$i', 1)" >/dev/null; done
python3 -c "print('\n'.join([\"BEGIN; SELECT counter_incr('h', 1); INSERT INTO ledger_h VALUES (1); COMMIT; SELECT pg_sleep(0.02);\"] * 250))" >"$WORK/h.sql"
psql -X -q -d stress -f "$WORK/h.sql" >/dev/null
sleep 2
cluster_stop immediate
cluster_start
read -r total committed <<<"$(q "SELECT counter_value('h'), (SELECT sum(delta) FROM ledger_h)" | tr '|' ' ')"
echo "RESULT four counters held by prepared transactions; another's increments, all committed 2 s or more before an immediate shutdown: $total of $committed"
[ "$total" = "$committed" ] || fail "the worker's waits for held rows kept committed amounts from memcached and the rows"
for i in 1 2 3 4; do q "ROLLBACK PREPARED 'hold$i'" >/dev/null; done
worker_settled stress || fail "no worker after the restart"

echo "== 3. memcached_batch_delay = 0: one request per commit"
set_delay 0
reset
incr0="$(mc_incrs)"
run_sessions stress p3 4 script 400
wait_sessions
no_errors p3
commits="$(q "SELECT count(*) FROM ledger")"
incrs=$(( $(mc_incrs) - incr0 ))
echo "RESULT with no delay, memcached took $incrs requests for $commits committed increments"
[ "$incrs" -ge $((commits / 2)) ] || fail "memcached_batch_delay = 0 still batches"
q "SELECT sharded_seq.flush_counters()" >/dev/null
check = "unbatched, after flush_counters"
set_delay 10ms

echo "== 4. an immediate shutdown under load"
reset
run_sessions stress p4 $SESSIONS script 100000
sleep 6
crash_at="$(date +%s.%N)"
cluster_stop immediate
wait_sessions
sessions_cut_off p4 $SESSIONS
cluster_start
check "<=" "after an immediate shutdown"
read -r total floor <<<"$(q "SELECT (SELECT sum(counter_value(name)) FROM sharded_seq.counters WHERE name IN ('m', 'm4')),
                                   (SELECT coalesce(sum(delta), 0) FROM ledger WHERE counter IN ('m', 'm4') AND at < to_timestamp($crash_at) - interval '3 s')" | tr '|' ' ')"
echo "RESULT after an immediate shutdown: total $total, committed up to 3 s before the crash $floor"
[ "$floor" -gt 1000 ] || fail "too little committed before the crash: test is void"
[ "$total" -ge "$floor" ] || fail "the immediate shutdown lost more than the last moments"

echo "== 5. memcached flush_all, then killed and restarted empty, under load"
worker_settled stress || fail "no worker after the restart"
reset
run_sessions stress p5 $SESSIONS script 6000
sleep 2
memcached_cmd "$MC_PORT" flush_all >/dev/null
sleep 1
memcached_kill KILL
sleep 2
memcached_start "$MC_PORT" >/dev/null
wait_sessions
no_errors p5
sleep 2
q "SELECT sharded_seq.flush_counters()" >/dev/null
check "<=" "after flush_all and a memcached restart"
read -r total ledger <<<"$(q "SELECT (SELECT sum(counter_value(name)) FROM sharded_seq.counters WHERE name IN ('m', 'm4')),
                                    (SELECT coalesce(sum(delta), 0) FROM ledger WHERE counter IN ('m', 'm4'))" | tr '|' ' ')"
echo "RESULT memcached lost $((ledger - total)) of $ledger committed"
[ "$total" -gt 0 ] || fail "nothing counted: test is void"
echo "PASS"

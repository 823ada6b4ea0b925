#!/usr/bin/env bash
# S1 across failover to a synchronous standby.  A primary streams to a
# standby named in synchronous_standby_names ('*', synchronous_commit = on).
# Sessions open transactions that stay open and draw a few values while the
# standby keeps up, then the standby's WAL receiver is stopped (SIGSTOP) and
# they draw 300 more each from a database-tier sequence and a memcached-tier
# one, and from a native sequence for comparison.  Two more sessions have
# their waits cancelled (statement_timeout, pg_cancel_backend).  Then the
# primary crashes, the stalled receiver is killed with what it had not read,
# the standby is promoted and draws past everything handed out before.
# No sharded value may come back; native nextval must (else the scenario did
# not bite); a cancelled wait must raise an error and hand out nothing, and a
# wait released by emptying synchronous_standby_names hands out its block.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
SESSIONS=8		# database-tier sessions
MC_SESSIONS=4	# memcached-tier sessions
NATIVE=2		# native nextval sessions
BEFORE=25		# values each session draws while the standby keeps up
STALLED=300		# values each session asks for while it is stalled
WORK="$(mktemp -d /tmp/ss_failover.XXXXXX)"
chmod 755 "$WORK"
STANDBY="$WORK/standby"
WALRCV=""
cleanup() {
    [ -n "$WALRCV" ] && kill -CONT "$WALRCV" 2>/dev/null
    as_pg "$PGBIN/pg_ctl" -D "$STANDBY/data" -m immediate -w stop >/dev/null 2>&1 || true
    memcached_kill KILL
    cluster_destroy >/dev/null 2>&1 || true
    if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
fail=0
sq() { psql -qXAt -v ON_ERROR_STOP=1 "$@"; }	# primary by default (PGPORT)
ssq() { sq -p "$SPORT" "$@"; }					# the standby
# repeat N SQL: N lines of SQL
repeat() { local i; for i in $(seq 1 "$1"); do echo "$2"; done; }

MC_PORT="$(free_port)"
memcached_start "$MC_PORT"
cluster_create "$WORK/primary"
cat >>"$PGDATA/postgresql.conf" <<CONF
shared_preload_libraries = 'sharded_seq'
sharded_seq.memcached_servers = '127.0.0.1:$MC_PORT'
synchronous_commit = on
wal_sender_timeout = 0
CONF
cluster_start
db_create stress
# one shard each: one session's draws on the promoted node then cover every
# block the old primary carved
sq -d stress <<'SQL' >/dev/null
SELECT sharded_seq.create_sequence('s', shards => 1, block => 20);
SELECT sharded_seq.create_sequence('m', tier => 'memcached', block => 10);
CREATE SEQUENCE native_s;
SQL

# timed N SEQ: milliseconds to draw N values of SEQ on the primary
timed() {
    sq -d stress -c "\\timing on" -c "SELECT count(sharded_nextval('$2')) FROM generate_series(1, $1)" \
        | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p'
}
# blocks of 20 from one shard: a WAL record reserves 32 blocks ahead, so
# about one block in 32 writes WAL and waits
no_sync_ms=$(timed 20000 s)

echo "standby: pg_basebackup -R, then synchronous_standby_names = '*'"
mkdir -p "$STANDBY"
[ "$(id -u)" = 0 ] && chown postgres: "$STANDBY"
as_pg "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "$PGPORT" -U postgres -D "$STANDBY/data" -R -X stream -c fast \
    >"$WORK/basebackup.log" 2>&1 || { cat "$WORK/basebackup.log"; exit 1; }
SPORT="$(free_port)"
cat >>"$STANDBY/data/postgresql.conf" <<CONF
port = $SPORT
unix_socket_directories = '$STANDBY'
CONF
as_pg "$PGBIN/pg_ctl" -D "$STANDBY/data" -l "$STANDBY/server.log" -w -t 60 start >/dev/null
# set after the base backup: the promoted standby must not wait for anyone
sq -c "ALTER SYSTEM SET synchronous_standby_names = '*'" -c "SELECT pg_reload_conf()" >/dev/null
for _ in $(seq 1 100); do
    [ "$(sq -c "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")" = 1 ] && break
    sleep 0.2
done
[ "$(sq -c "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")" = 1 ] \
    || { echo "the standby did not become synchronous"; exit 1; }
sync_ms=$(timed 20000 s)
echo "RESULT 20000 values in 1000 blocks: ${no_sync_ms} ms with synchronous_standby_names empty, ${sync_ms} ms with a synchronous standby"

echo "sessions open transactions and draw $BEFORE values each while the standby keeps up"
names=()
for i in $(seq 1 $SESSIONS); do names+=("s$i"); done
for i in $(seq 1 $MC_SESSIONS); do names+=("m$i"); done
for i in $(seq 1 $NATIVE); do names+=("n$i"); done
draw_sql() {  # draw_sql NAME N: N draws of the sequence session NAME uses
    case "$1" in
        s*) repeat "$2" "SELECT sharded_nextval('s');" ;;
        m*) repeat "$2" "SELECT sharded_nextval('m');" ;;
        n*) repeat "$2" "SELECT nextval('native_s');" ;;
    esac
}
for n in "${names[@]}"; do
    session_open "$n"
    session_send "$n" "BEGIN;"
    session_send "$n" "$(draw_sql "$n" $BEFORE)"
done
for n in "${names[@]}"; do session_sync "$n"; done
for n in "${names[@]}"; do cp "$WORK/$n.out" "$WORK/$n.before"; done

# everything so far is on the standby, and a checkpoint makes the next
# reservation of every sequence write WAL of its own
sq -d stress -c "CHECKPOINT" >/dev/null
target="$(sq -c "SELECT pg_current_wal_flush_lsn()")"
for _ in $(seq 1 100); do
    [ "$(sq -c "SELECT flush_lsn >= '$target' FROM pg_stat_replication")" = t ] && break
    sleep 0.1
done
WALRCV="$(ssq -d postgres -c "SELECT pid FROM pg_stat_wal_receiver")"
[ -n "$WALRCV" ] || { echo "no WAL receiver on the standby"; exit 1; }
kill -STOP "$WALRCV"
echo "standby's WAL receiver $WALRCV stopped; each session asks for $STALLED more values"
for n in "${names[@]}"; do session_send "$n" "$(draw_sql "$n" $STALLED)"; done

# wait until every session has finished its draws or waits
stuck="state = 'active' AND application_name ~ '^[smnc][0-9]+\$'"
for _ in $(seq 1 150); do
    busy=$(sq -c "SELECT count(*) FROM pg_stat_activity WHERE $stuck
                    AND wait_event IS DISTINCT FROM 'SyncRep' AND wait_event_type IS DISTINCT FROM 'Lock'")
    [ "$busy" = 0 ] && break
    sleep 0.2
done
sq -c "SELECT 'RESULT sessions stalled: ' || count(*) FILTER (WHERE wait_event = 'SyncRep') || ' waiting for the standby, '
              || count(*) FILTER (WHERE wait_event_type = 'Lock') || ' behind a lease rebuild'
         FROM pg_stat_activity WHERE $stuck"

echo "cancelled waits: statement_timeout (c1) and pg_cancel_backend (c2)"
session_open c1
session_send c1 "SET statement_timeout = '1s';"
session_send c1 "BEGIN; SELECT sharded_nextval('s');"
session_send c1 "ROLLBACK; SELECT sharded_nextval('s');"
session_sync c1
# c2 waits; the wait is cancelled; its next call must wait again, not use
# the block whose wait was cancelled
waiting_c2() {
    for _ in $(seq 1 50); do
        [ "$(sq -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'c2' AND wait_event = 'SyncRep'")" = 1 ] \
            && return 0
        sleep 0.1
    done
    return 1
}
session_open c2
session_send c2 "SELECT sharded_nextval('s');"
c2_waited=no c2_waited_again=no
if waiting_c2; then
    c2_waited=yes
    sq -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'c2'" >/dev/null
    session_sync c2
    session_send c2 "SELECT sharded_nextval('s');"
    waiting_c2 && c2_waited_again=yes
else
    session_sync c2
fi
c1_errors=$(session_errors c1 | grep -c 57014 || true)
c2_errors=$(session_errors c2 | grep -c 57014 || true)
c_values=$(cat "$WORK/c1.out" "$WORK/c2.out" | grep -c '^[0-9]' || true)
echo "RESULT cancel: c1 got $c1_errors errors 57014 of 2; c2 waited $c2_waited, got $c2_errors of 1, then waited again $c2_waited_again; $c_values values handed out"
grep -m 1 -A 3 'ERROR:' "$WORK/c2.err" | sed 's/^/    c2: /' || true
# a memcached-tier session waiting on its new lease (the others wait for its
# rebuild lock) is cancelled: the lease is not published, and the next
# session to take the lock carves another one and waits in turn
msql="SELECT application_name FROM pg_stat_activity WHERE application_name ~ '^m[0-9]+\$' AND wait_event = 'SyncRep'"
mcancelled="$(sq -c "$msql")"
m_errors=0 m_waited_again=no
if [ -n "$mcancelled" ]; then
    sq -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = '$mcancelled'" >/dev/null
    for _ in $(seq 1 50); do
        m_errors=$(session_errors "$mcancelled" | grep -c 57014 || true)
        [ "$m_errors" -gt 0 ] && [ -n "$(sq -c "$msql")" ] && { m_waited_again=yes; break; }
        sleep 0.1
    done
fi
echo "RESULT cancel: memcached-tier session '${mcancelled:-none}' waiting on a new lease got $m_errors errors 57014 of 1; another waited on a new lease then: $m_waited_again"
# a termination during the wait ends that session only: no crash restart
c2_gone=no
if [ "$c2_waited_again" = yes ]; then
    sq -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'c2'" >/dev/null
    for _ in $(seq 1 50); do
        [ "$(sq -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'c2'")" = 0 ] && { c2_gone=yes; break; }
        sleep 0.1
    done
fi
still=$(sq -c "SELECT count(*) FROM pg_stat_activity WHERE application_name ~ '^s[0-9]+\$' AND wait_event = 'SyncRep'")
echo "RESULT terminate: c2 ended $c2_gone; $still of $SESSIONS database-tier sessions still waiting"
if [ "$c1_errors" != 2 ] || [ "$c2_errors" != 1 ] || [ "$c2_waited_again" != yes ] || [ "$c_values" != 0 ] \
   || [ "$m_errors" != 1 ] || [ "$m_waited_again" != yes ] || [ "$c2_gone" != yes ] || [ "$still" != $SESSIONS ]; then
    echo "FAIL: a cancelled wait must raise an error and hand out no value"
    fail=1
fi

echo "the primary crashes; the stalled WAL receiver is killed; the standby is promoted"
cluster_stop immediate
kill -KILL "$WALRCV" || true; kill -CONT "$WALRCV" 2>/dev/null || true
WALRCV=""
for n in "${names[@]}" c1 c2; do
    eval "exec {SESSION_FD_$n}>&-"
    eval "wait \$SESSION_PID_$n" 2>/dev/null || true
done
for _ in $(seq 1 120); do
    ssq -d postgres -c "SELECT 1" >/dev/null 2>&1 && break
    sleep 0.5
done
as_pg "$PGBIN/pg_ctl" -D "$STANDBY/data" -w -t 60 promote >/dev/null
[ "$(ssq -d postgres -c "SELECT pg_is_in_recovery()")" = f ] || { echo "the standby was not promoted"; exit 1; }

# what each kind of session received before the crash, and during the stall
received() {  # received PREFIX: every value sessions PREFIX* received
    cat "$WORK"/$1[0-9]*.out | grep '^-\?[0-9]\+$' || true
}
stalled() {  # stalled PREFIX: how many values they received during the stall
    local n=0 f
    for f in "$WORK"/$1[0-9]*.out; do
        n=$((n + $(grep -c '^-\?[0-9]\+$' "$f" || true) - $(grep -c '^-\?[0-9]\+$' "${f%.out}.before" || true)))
    done
    echo $n
}
received s >"$WORK/pre.s"; received m >"$WORK/pre.m"; received n >"$WORK/pre.n"
received c >>"$WORK/pre.s"
echo "RESULT received while the standby was stalled: $(stalled s) of $((SESSIONS * STALLED)) database-tier," \
     "$(stalled m) of $((MC_SESSIONS * STALLED)) memcached-tier, $(stalled n) of $((NATIVE * STALLED)) native"

# draw past everything the old primary could have handed out
post=$(( (SESSIONS + 2) * (BEFORE + STALLED) * 2 ))
ssq -d stress -c "SELECT sharded_nextval('s') FROM generate_series(1, $post)" >"$WORK/post.s"
ssq -d stress -c "SELECT sharded_nextval('m') FROM generate_series(1, $(( MC_SESSIONS * (BEFORE + STALLED) * 2 + 1000 )))" >"$WORK/post.m"
ssq -d stress -c "SELECT nextval('native_s') FROM generate_series(1, $(( NATIVE * (BEFORE + STALLED) * 2 )))" >"$WORK/post.n"

# like a commit, a wait ends without an error when synchronous_standby_names
# is emptied: the promoted node names a standby it does not have, then not
ssq -c "ALTER SYSTEM SET synchronous_standby_names = '*'" -c "SELECT pg_reload_conf()" >/dev/null
sleep 1
PGPORT="$SPORT" session_open r1
session_send r1 "SELECT sharded_nextval('s') FROM generate_series(1, 100);"
r1_waited=no
for _ in $(seq 1 50); do
    [ "$(ssq -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'r1' AND wait_event = 'SyncRep'")" = 1 ] \
        && { r1_waited=yes; break; }
    sleep 0.1
done
ssq -c "ALTER SYSTEM RESET synchronous_standby_names" -c "SELECT pg_reload_conf()" >/dev/null
session_sync r1
session_close r1
r1_values=$(grep -c '^[0-9]' "$WORK/r1.out" || true)
r1_errors=$(grep -c 'ERROR' "$WORK/r1.err" || true)
echo "RESULT released: with a standby named but absent the draw waited $r1_waited; emptying synchronous_standby_names released it with $r1_values of 100 values and $r1_errors errors"
if [ "$r1_waited" != yes ] || [ "$r1_values" != 100 ] || [ "$r1_errors" != 0 ]; then
    echo "FAIL: a wait released by emptying synchronous_standby_names must hand out its block"
    fail=1
fi
cat "$WORK/r1.out" >>"$WORK/post.s"

python3 - "$WORK" <<'PY' || fail=1
import sys
work = sys.argv[1]
def values(name):
    return [int(l) for l in open(f"{work}/{name}") if l.strip().lstrip("-").isdigit()]
bad = False
for kind, label in (("s", "database tier"), ("m", "memcached tier"), ("n", "native nextval")):
    pre, post = values(f"pre.{kind}"), values(f"post.{kind}")
    reissued = len(set(pre) & set(post))
    twice_before = len(pre) - len(set(pre))
    print(f"RESULT {label}: {len(pre)} values handed out before the failover, {reissued} handed out again "
          f"by the promoted standby (it drew {len(post)}, up to {max(post)}; the old primary's highest was {max(pre)})")
    if kind == "n":
        if reissued == 0:
            print("FAIL: native nextval reissued nothing: the scenario did not bite")
            bad = True
        continue
    if reissued or twice_before:
        print(f"FAIL: {label}: {reissued} values reissued after failover, {twice_before} repeated before it")
        bad = True
    if max(post) <= max(pre):
        print(f"FAIL: {label}: the promoted standby did not draw past the old primary's values: test is void")
        bad = True
sys.exit(1 if bad else 0)
PY
exit $fail

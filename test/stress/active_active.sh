#!/usr/bin/env bash
# Active-active on PostgreSQL 16 or later (logical replication both ways with
# origin = none, which 16 brought).  Two servers on loopback, node ids 1 and
# 2 (ALTER SYSTEM and a reload), each publishing sharded_seq's
# replicated_tables() and a table orders whose id defaults to
# sharded_nextval('orders_id'), each subscribed to the other.  The sequence is
# created on each node, the counters once, on node 1.  Sessions on both nodes
# at once insert orders and call counter_incr in the same transactions, some
# rolled back, with maintain() running on both, then folding each node's
# grown rows back.  Then: the same committed rows on both nodes, every id in
# its node's range, no apply error in either log or in
# pg_stat_subscription_stats, and every counter equal to the committed rows
# on both nodes.  A revoke made on node 1 must reach a session on node 2 that
# cached the counter (the replica trigger on counter_config).
# A third server with node id 1 (taken), subscribed to the group with
# copy_data = true, must refuse sharded_nextval and counter_incr with 55000
# once the claims have reached it.  Last, the same group with node id 0 on
# both servers must collide (duplicate ids stop an apply worker): node ids
# are what prevents it.  PostgreSQL 15 has no origin = none: skipped there.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
major="$("$PGBIN/postgres" -V | sed -E 's/.* ([0-9]+)[.a-z].*/\1/')"
if [ "$major" -lt 16 ]; then
    echo "SKIP active_active: needs PostgreSQL 16 or later (subscriptions with origin = none); this is $major"
    exit 77
fi
SESSIONS=4		# per node
TXNS=1500		# transactions per session; every 7th rolls back
WORK="$(mktemp -d /tmp/ss_active.XXXXXX)"
chmod 755 "$WORK"
declare -A PORT
NODES=()
cleanup() {
    for n in "${NODES[@]}"; do
        as_pg "$PGBIN/pg_ctl" -D "$WORK/$n/data" -m immediate -w stop >/dev/null 2>&1 || true
    done
    if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
q() { local n="$1"; shift; psql -qXAt -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "${PORT[$n]}" -U postgres "$@"; }

# node_start NAME: a server on a free loopback port, with logical decoding
node_start() {
    local n="$1" dir="$WORK/$1"
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    as_pg "$PGBIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 --no-sync \
        >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log"; exit 1; }
    PORT[$n]="$(free_port)"
    cat >>"$dir/data/postgresql.conf" <<CONF
port = ${PORT[$n]}
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10
max_worker_processes = 16
max_logical_replication_workers = 8
log_min_messages = warning
log_line_prefix = '%m [%p] %b '
sharded_seq.counter_fold_after = 1
CONF
    as_pg "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null
    NODES+=("$n")
}
log_size() { stat -c %s "$WORK/$1/server.log"; }
# apply_errors NAME FROM: error and conflict lines of NAME's log past byte FROM
apply_errors() { tail -c "+$(($2 + 1))" "$WORK/$1/server.log" | grep -E 'ERROR|conflict|duplicate key' || true; }

# group_setup DB NODE...: in DB on each NODE, the extension, orders, a
# publication of orders and replicated_tables(), and a subscription to every
# other node (origin = none, copy_data = false).  Then orders_id on each node
# and the counters once, on the first, replicated to the others: after the
# subscriptions, so that the claims the first uses make reach every node.
group_setup() {
    local db="$1" n m
    shift
    for n in "$@"; do
        q "$n" -d postgres -c "CREATE DATABASE $db"
        q "$n" -d "$db" <<'SQL' >/dev/null
CREATE EXTENSION sharded_seq;
CREATE TABLE orders (
    id      bigint PRIMARY KEY DEFAULT sharded_nextval('orders_id'),
    node    integer NOT NULL,
    session integer NOT NULL,
    k       integer NOT NULL,
    j       integer NOT NULL
);
SELECT format('CREATE PUBLICATION grp FOR TABLE orders, %s', string_agg(t::text, ', '))
  FROM sharded_seq.replicated_tables() t \gexec
SQL
    done
    # one at a time: each creates a slot on the other, which waits for the
    # other's running transactions
    for n in "$@"; do
        for m in "$@"; do
            [ "$n" = "$m" ] && continue
            out="$(q "$n" -d "$db" -c "CREATE SUBSCRIPTION ${db}_${n}_from_${m}
                CONNECTION 'host=127.0.0.1 port=${PORT[$m]} user=postgres dbname=$db'
                PUBLICATION grp WITH (origin = none, copy_data = false)" 2>&1)" \
                || { echo "$out"; exit 1; }
        done
    done
    for n in "$@"; do
        q "$n" -d "$db" -c "SELECT sharded_seq.create_sequence('orders_id')" >/dev/null
    done
    q "$1" -d "$db" -c "SELECT sharded_seq.create_counter('orders_count')" \
                    -c "SELECT sharded_seq.create_counter('orders_pinned', shards => 4)" >/dev/null
    for n in "$@"; do
        for _ in $(seq 1 150); do
            [ "$(q "$n" -d "$db" -c "SELECT count(*) FROM sharded_seq.counter_config")" = 2 ] && break
            sleep 0.2
        done
        [ "$(q "$n" -d "$db" -c "SELECT count(*) FROM sharded_seq.counter_config")" = 2 ] \
            || { echo "the counters did not reach $n"; exit 1; }
    done
}

# load DB NODE SESSION TXNS: one session's transactions, each inserting 1-3
# orders and adding as many to both counters; every 7th rolls back
load_sql() {
    local node="$1" s="$2" txns="$3" k r
    for k in $(seq 1 "$txns"); do
        r=$(( 1 + (k + s) % 3 ))
        echo "BEGIN;"
        echo "INSERT INTO orders (node, session, k, j) SELECT $node, $s, $k, j FROM generate_series(1, $r) j;"
        echo "SELECT counter_incr('orders_count', $r), counter_incr('orders_pinned', $r);"
        if [ $((k % 7)) = 0 ]; then echo "ROLLBACK;"; else echo "COMMIT;"; fi
    done
}
expected_rows() {  # committed rows of SESSIONS sessions on each of NODES nodes
    local total=0 s k
    for s in $(seq 1 "$2"); do
        for k in $(seq 1 "$3"); do
            [ $((k % 7)) = 0 ] || total=$((total + 1 + (k + s) % 3))
        done
    done
    echo $((total * $1))
}
# run_load DB NODE...: every node's sessions at once, and maintain() on each
run_load() {
    local db="$1" pids=() n i id=0 rc=0
    shift
    for n in "$@"; do
        id=$((id + 1))
        for i in $(seq 1 $SESSIONS); do
            load_sql "$id" "$i" "$TXNS" >"$WORK/load.$db.$n.$i.sql"
            psql -qXAt -v ON_ERROR_STOP="${LOAD_STOP:-1}" -h 127.0.0.1 -p "${PORT[$n]}" -U postgres -d "$db" \
                -f "$WORK/load.$db.$n.$i.sql" >/dev/null 2>"$WORK/load.$db.$n.$i.err" &
            pids+=($!)
        done
        ( while [ ! -e "$WORK/load.$db.done" ]; do
              q "$n" -d "$db" -c "SELECT folded + compacted FROM sharded_seq.maintain()" \
                  >>"$WORK/maintain.$db.$n.out" 2>>"$WORK/maintain.$db.$n.err" || true
              sleep 0.3
          done ) &
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    touch "$WORK/load.$db.done"
    wait
    return $rc
}

# node_state NODE DB: rows, a digest of them, totals, and a digest of the counter rows
node_state() {
    q "$1" -d "$2" -c "SELECT count(*) || ' ' || md5(coalesce(string_agg(id || ':' || node || ':' || session || ':' || k || ':' || j, ',' ORDER BY id), ''))
                             || ' ' || counter_value('orders_count') || ' ' || counter_value('orders_pinned')
                             || ' ' || (SELECT md5(string_agg(counter_id || ':' || shard || ':' || value, ',' ORDER BY counter_id, shard))
                                          FROM sharded_seq.counter_shards)
                         FROM orders"
}

############################################################################
echo "two servers, node ids 1 and 2, publishing to each other"
node_start n1
node_start n2
for n in n1 n2; do
    q "$n" -d postgres -c "LOAD 'sharded_seq'" -c "ALTER SYSTEM SET sharded_seq.node_id = ${n#n}" \
        -c "SELECT pg_reload_conf()" >/dev/null
done
sleep 0.5
for n in n1 n2; do
    got="$(q "$n" -d postgres -c "LOAD 'sharded_seq'" -c "SHOW sharded_seq.node_id")"
    [ "$got" = "${n#n}" ] || { echo "$n did not take node id ${n#n} (shows $got)"; exit 1; }
done
group_setup app n1 n2
log1=$(log_size n1); log2=$(log_size n2)
start=$(date +%s)
echo "load: $SESSIONS sessions per node, $TXNS transactions each, both nodes at once"
run_load app n1 n2 || { bad "a load session failed"; cat "$WORK"/load.app.*.err; }
expected=$(expected_rows 2 $SESSIONS $TXNS)
echo "RESULT load ran $(( $(date +%s) - start ))s; $expected rows committed"
# idle now: two fold passes a second apart fold each node's grown rows back,
# and the deletes replicate
for n in n1 n2; do q "$n" -d app -c "SELECT sharded_seq.maintain()" >/dev/null; done
sleep 1.2
for n in n1 n2; do
    echo "RESULT maintain() on $n after the load: $(q "$n" -d app -c "SELECT folded || ' folded, ' || compacted || ' gathered' FROM sharded_seq.maintain()")"
done

# replication catches up when both nodes show the same state with every row
start=$(date +%s)
converged=0
for _ in $(seq 1 120); do
    s1="$(node_state n1 app)"; s2="$(node_state n2 app)"
    if [ "$s1" = "$s2" ] && [ "${s1%% *}" = "$expected" ]; then converged=1; break; fi
    sleep 0.5
done
echo "RESULT caught up within $(( $(date +%s) - start ))s"
echo "RESULT node 1: $(node_state n1 app | cut -d' ' -f1,3,4) (rows, orders_count, orders_pinned)"
echo "RESULT node 2: $(node_state n2 app | cut -d' ' -f1,3,4)"
[ $converged = 1 ] || bad "the nodes did not converge on the $expected committed rows"
for n in n1 n2; do
    [ "$(q $n -d app -c "SELECT count(*) FROM orders")" = "$expected" ] || bad "$n does not hold every committed row"
    [ "$(q $n -d app -c "SELECT count(*) FROM orders WHERE k % 7 = 0")" = 0 ] || bad "$n holds rolled-back rows"
    [ "$(q $n -d app -c "SELECT count(*) FROM orders WHERE id >> 53 <> node")" = 0 ] \
        || bad "$n holds ids outside their node's range"
    [ "$(q $n -d app -c "SELECT count(DISTINCT id) FROM orders")" = "$expected" ] || bad "$n: an id twice"
    for c in orders_count orders_pinned; do
        [ "$(q $n -d app -c "SELECT counter_value('$c')")" = "$expected" ] \
            || bad "$n: $c is $(q $n -d app -c "SELECT counter_value('$c')"), not $expected"
        [ "$(q $n -d app -c "SELECT total FROM sharded_seq.counters WHERE name = '$c'")" = "$expected" ] \
            || bad "$n: the counters view's total of $c is not $expected"
    done
    [ "$(q $n -d app -c "SELECT string_agg(DISTINCT (shard / 1024)::text, ',' ORDER BY (shard / 1024)::text) FROM sharded_seq.counter_shards")" = "1,2" ] \
        || bad "$n: counter rows outside nodes 1 and 2's shards"
    errs="$(q $n -d app -c "SELECT coalesce(sum(apply_error_count + sync_error_count), 0) FROM pg_stat_subscription_stats")"
    [ "$errs" = 0 ] || bad "$n: pg_stat_subscription_stats counts $errs errors"
done
echo "RESULT counter rows on node 1: $(q n1 -d app -c "SELECT string_agg(c.name || ' ' || (SELECT count(*) FROM sharded_seq.counter_shards s WHERE s.counter_id = c.id AND s.shard / 1024 = n) || ' of node ' || n, ', ' ORDER BY c.name, n) FROM sharded_seq.counter_config c, generate_series(1, 2) n")"
e1="$(apply_errors n1 "$log1")"; e2="$(apply_errors n2 "$log2")"
[ -z "$e1$e2" ] || { bad "errors or conflicts in the server logs"; echo "$e1"; echo "$e2"; }
[ -s "$WORK/maintain.app.n1.err" ] && { bad "maintain() failed on node 1"; cat "$WORK/maintain.app.n1.err"; }
[ -s "$WORK/maintain.app.n2.err" ] && { bad "maintain() failed on node 2"; cat "$WORK/maintain.app.n2.err"; }
for n in n1 n2; do
    echo "RESULT maintain() ran $(wc -l <"$WORK/maintain.app.$n.out") times on $n during the load"
done
echo "RESULT claims: $(q n1 -d app -c "SELECT string_agg(node_id || '=' || system_identifier, ' ' ORDER BY node_id) FROM sharded_seq.node_claims")"

############################################################################
echo "a grant and a revoke made on node 1 reach a session on node 2 that cached the counter"
for n in n1 n2; do q "$n" -d app -c "CREATE ROLE app_user LOGIN" >/dev/null; done
acl_on_n2() {  # acl_on_n2 WANT: wait until node 2's acl of orders_count mentions app_user (t) or not (f)
    for _ in $(seq 1 100); do
        [ "$(q n2 -d app -c "SELECT coalesce(acl::text ~ 'app_user', false) FROM sharded_seq.counter_config WHERE name = 'orders_count'")" = "$1" ] && return 0
        sleep 0.1
    done
    return 1
}
q n1 -d app -c "SELECT sharded_seq.grant_counter('orders_count', 'app_user', 'update')" >/dev/null
acl_on_n2 t || bad "the grant did not reach node 2"
PGHOST=127.0.0.1 PGPORT="${PORT[n2]}" PGUSER=app_user session_open u2 app
session_send u2 "SELECT 'before', counter_incr('orders_count', 0);"
session_sync u2
q n1 -d app -c "SELECT sharded_seq.revoke_counter('orders_count', 'app_user', 'update')" >/dev/null
acl_on_n2 f || bad "the revoke did not reach node 2"
session_send u2 "SELECT 'after', counter_incr('orders_count', 0);"
session_sync u2
session_close u2
if grep -q '^before|' "$WORK/u2.out" && ! grep -q '^after|' "$WORK/u2.out" && [ "$(session_errors u2)" = 42501 ]; then
    echo "RESULT a revoke replicated from node 1 applies at once to a session on node 2 (42501)"
else
    bad "the session on node 2 did not see the replicated revoke: $(cat "$WORK/u2.out" "$WORK/u2.err")"
fi

############################################################################
echo "a third server with node id 1, which node 1 holds, joins the group"
node_start n3
# the sequence first, as node 0: drawing as node 1 before the claims arrive
# would make this server claim node 1 too, and the claims' copy would fail
q n3 -d postgres -c "CREATE DATABASE app"
q n3 -d app <<'SQL' >/dev/null
CREATE EXTENSION sharded_seq;
CREATE TABLE orders (
    id      bigint PRIMARY KEY DEFAULT sharded_nextval('orders_id'),
    node    integer NOT NULL,
    session integer NOT NULL,
    k       integer NOT NULL,
    j       integer NOT NULL
);
SELECT sharded_seq.create_sequence('orders_id');
ALTER SYSTEM SET sharded_seq.node_id = 1;
SELECT pg_reload_conf();
SQL
# origin = none with copy_data warns that node 1's tables hold node 2's rows:
# they are meant to come along
out="$(q n3 -d app -c "CREATE SUBSCRIPTION app_n3_from_n1
    CONNECTION 'host=127.0.0.1 port=${PORT[n1]} user=postgres dbname=app'
    PUBLICATION grp WITH (origin = none, copy_data = true)" 2>&1)" || { echo "$out"; exit 1; }
for _ in $(seq 1 150); do
    [ "$(q n3 -d app -c "SELECT count(*) FILTER (WHERE srsubstate <> 'r') || ' ' || count(*) FROM pg_subscription_rel")" = "0 4" ] && break
    sleep 0.2
done
[ "$(q n3 -d app -c "SELECT count(*) FROM sharded_seq.node_claims")" = 2 ] || bad "the claims did not reach the third server"
[ "$(q n3 -d app -c "SELECT count(*) FROM orders")" = "$expected" ] || bad "the orders did not reach the third server"
for stmt in "SELECT sharded_nextval('orders_id')" "SELECT counter_incr('orders_count')" \
            "INSERT INTO orders (node, session, k, j) VALUES (3, 1, 1, 1)"; do
    out="$(psql -qXAt -v VERBOSITY=verbose -h 127.0.0.1 -p "${PORT[n3]}" -U postgres -d app -c "$stmt" 2>&1 || true)"
    sysid1="$(q n1 -d app -c "SELECT system_identifier FROM pg_control_system()")"
    sysid3="$(q n3 -d app -c "SELECT system_identifier FROM pg_control_system()")"
    if echo "$out" | grep -q "ERROR:  55000: sharded_seq.node_id 1 is claimed by system $sysid1, database \"app\", not by this one (system $sysid3, database \"app\")"; then
        echo "RESULT third node, $stmt: $(echo "$out" | grep -m1 ERROR)"
    else
        bad "the third node did not refuse '$stmt' with 55000 naming both claims: $out"
    fi
done
[ "$(q n3 -d app -c "SELECT count(*) FROM sharded_seq.node_claims WHERE node_id = 1")" = 1 ] \
    || bad "the third node recorded a claim of its own"
[ "$(q n3 -d app -c "SELECT count(*) FROM orders")" = "$expected" ] || bad "the refused insert left a row"
[ "$(q n3 -d app -c "SELECT coalesce(sum(apply_error_count + sync_error_count), 0) FROM pg_stat_subscription_stats")" = 0 ] \
    || bad "the third node's subscription had errors"

############################################################################
echo "without node ids (node 0 on both servers), the same group collides"
for n in n1 n2; do
    q "$n" -d postgres -c "LOAD 'sharded_seq'" -c "ALTER SYSTEM RESET sharded_seq.node_id" -c "SELECT pg_reload_conf()" >/dev/null
done
sleep 0.5
log1=$(log_size n1); log2=$(log_size n2)
group_setup zero n1 n2
# sessions go on after an error: each failed transaction is one collision
TXNS=100 LOAD_STOP=0 run_load zero n1 n2 || true
# an apply worker's error reaches the statistics as it exits
for _ in $(seq 1 25); do
    errs=$(( $(q n1 -d zero -c "SELECT coalesce(sum(apply_error_count), 0) FROM pg_stat_subscription_stats") \
           + $(q n2 -d zero -c "SELECT coalesce(sum(apply_error_count), 0) FROM pg_stat_subscription_stats") ))
    [ "$errs" -gt 0 ] && break
    sleep 0.2
done
e="$(apply_errors n1 "$log1"; apply_errors n2 "$log2")"
dup='duplicate key value violates unique constraint "orders_pkey"'
in_apply=$(echo "$e" | grep 'logical replication' | grep -c "$dup" || true)
in_sessions=$(echo "$e" | grep 'client backend' | grep -c "$dup" || true)
echo "RESULT node 0 on both: the same ids drawn on both servers; $in_sessions transactions failed on an id the other server had used, $in_apply apply workers stopped on one ($errs apply errors counted); rows $(q n1 -d zero -c "SELECT count(*) FROM orders") and $(q n2 -d zero -c "SELECT count(*) FROM orders")"
if [ $((in_apply + in_sessions)) -gt 0 ]; then
    echo "RESULT without node ids the servers drew the same ids: they collide"
else
    bad "node 0 on both servers did not collide: the test could not tell node ids from luck"
fi
q n1 -d zero -c "ALTER SUBSCRIPTION zero_n1_from_n2 DISABLE" >/dev/null
q n2 -d zero -c "ALTER SUBSCRIPTION zero_n2_from_n1 DISABLE" >/dev/null

[ $fail = 0 ] && echo "active-active: ok"
exit $fail

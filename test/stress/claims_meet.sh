#!/usr/bin/env bash
# Two claims of one node id meet (S1 across primaries), on PostgreSQL 16 or
# later (origin = none).  Servers A (node 1) and B (node 2) replicate both
# ways as in active_active.sh and both draw.  Then C, also given node id 1,
# creates the extension and draws first, so that it holds a claim of its
# own, and joins: A subscribes to C and C to A, both with origin = none and
# copy_data = true.  Both claims of node 1 must stand side by side on A and
# on C (every table sync reaches 'r': no duplicate key on node_claims_pkey,
# neither for the other's claim nor for C's own claim that A copies back),
# and the later one, C's, must be refused with 55000 naming both claims:
# sharded_nextval and counter_incr, in a new session and in one that had
# checked its claim before A's arrived.  A must keep drawing (also a session
# that had checked its claim before C's arrived), and B too.  PostgreSQL 15
# has no origin = none: skipped there.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
major="$("$PGBIN/postgres" -V | sed -E 's/.* ([0-9]+)[.a-z].*/\1/')"
if [ "$major" -lt 16 ]; then
    echo "SKIP claims_meet: needs PostgreSQL 16 or later (subscriptions with origin = none); this is $major"
    exit 77
fi
WORK="$(mktemp -d /tmp/ss_claims.XXXXXX)"
chmod 755 "$WORK"
declare -A PORT
NODES=()
cleanup() {
    for v in ${!SESSION_FD_*}; do session_close "${v#SESSION_FD_}" || true; done
    for n in "${NODES[@]}"; do
        as_pg "$PGBIN/pg_ctl" -D "$WORK/$n/data" -m immediate -w stop >/dev/null 2>&1 || true
    done
    if [ -n "${KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
fail=0
failures=0
bad() { echo "FAIL: $*"; fail=1; failures=$((failures + 1)); }
# ok_since N LINE: print RESULT LINE if nothing failed since failures was N
ok_since() { [ "$failures" = "$1" ] && echo "RESULT $2"; return 0; }
q() { local n="$1"; shift; psql -qXAt -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "${PORT[$n]}" -U postgres "$@"; }
# wait_for NODE DB SQL WANT: poll SQL on NODE until it returns WANT (30 s at most)
wait_for() {
    local got=""
    for _ in $(seq 1 150); do
        got="$(q "$1" -d "$2" -c "$3" 2>/dev/null || true)"
        [ "$got" = "$4" ] && return 0
        sleep 0.2
    done
    echo "waited 30 s on $1 for '$3' to return '$4'; it returns '$got'"
    return 1
}

# node_start NAME ID: a server on a free loopback port, with logical decoding
# and sharded_seq.node_id = ID
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
sharded_seq.node_id = $2
CONF
    as_pg "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null
    NODES+=("$n")
    q "$n" -d postgres -c "CREATE DATABASE app"
    q "$n" -d app <<'SQL' >/dev/null
CREATE EXTENSION sharded_seq;
CREATE TABLE orders (
    id      bigint PRIMARY KEY DEFAULT sharded_nextval('orders_id'),
    node    text NOT NULL
);
SELECT format('CREATE PUBLICATION grp FOR TABLE orders, %s', string_agg(t::text, ', '))
  FROM sharded_seq.replicated_tables() t \gexec
SQL
    [ "$(q "$n" -d app -c "SELECT sharded_seq.node_id()")" = "$2" ] || { echo "$n is not node $2"; exit 1; }
}
# its first use claims the node id
sequence() { q "$1" -d app -c "SELECT sharded_seq.create_sequence('orders_id')" >/dev/null; }
# subscribe NODE FROM COPY: NODE subscribes to FROM's grp (origin = none)
subscribe() {
    local out
    out="$(q "$1" -d app -c "CREATE SUBSCRIPTION app_${1,,}_from_${2,,}
        CONNECTION 'host=127.0.0.1 port=${PORT[$2]} user=postgres dbname=app'
        PUBLICATION grp WITH (origin = none, copy_data = $3)" 2>&1)" || { echo "$out"; exit 1; }
}
# synced NODE FROM: the state of every table of NODE's subscription to FROM
synced() {
    q "$1" -d app -c "SELECT string_agg(r.srrelid::regclass || '=' || r.srsubstate::text, ' ' ORDER BY r.srrelid::regclass::text)
                        FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid
                       WHERE s.subname = 'app_${1,,}_from_${2,,}'"
}
all_ready() {
    wait_for "$1" app "SELECT count(*) FILTER (WHERE r.srsubstate <> 'r') || ' ' || count(*)
                         FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid
                        WHERE s.subname = 'app_${1,,}_from_${2,,}'" "0 4"
}
# the claims of node 1 on NODE, the one that holds the id first (ClaimCompare)
claims_of_1() {
    q "$1" -d app -c "SELECT string_agg(system_identifier || '/' || database, ' ' ORDER BY claimed_at,
                             length(system_identifier), system_identifier COLLATE \"C\", database COLLATE \"C\")
                        FROM sharded_seq.node_claims WHERE node_id = 1"
}
sysid() { q "$1" -d app -c "SELECT system_identifier FROM pg_control_system()"; }
# draws NODE: a value and an order drawn on NODE, and the counter incremented
draws() {
    q "$1" -d app -c "INSERT INTO orders (node) VALUES ('$1') RETURNING id >> 53" \
                  -c "SELECT counter_incr('orders_count') > 0"
}

############################################################################
echo "A (node 1) and B (node 2), active-active, both drawing"
node_start A 1
node_start B 2
subscribe A B false
subscribe B A false
# after the subscriptions, so that each claim reaches the other
sequence A
sequence B
q A -d app -c "SELECT sharded_seq.create_counter('orders_count')" >/dev/null
wait_for B app "SELECT count(*) FROM sharded_seq.counter_config" 1 || exit 1
[ "$(draws A | tr '\n' ' ')" = "1 t " ] || bad "A did not draw as node 1"
[ "$(draws B | tr '\n' ' ')" = "2 t " ] || bad "B did not draw as node 2"
for n in A B; do
    wait_for $n app "SELECT string_agg(node_id::text, ',' ORDER BY node_id) FROM sharded_seq.node_claims" "1,2" || exit 1
done
sysA="$(sysid A)"
# a session on A that checked its claim before C's arrives
PGHOST=127.0.0.1 PGPORT="${PORT[A]}" PGUSER=postgres session_open a1 app
session_send a1 "SELECT 'a1 before', sharded_nextval('orders_id') >> 53;"
session_sync a1

############################################################################
echo "C, given node id 1 too, draws before it joins"
node_start C 1
sequence C
sysC="$(sysid C)"
PGHOST=127.0.0.1 PGPORT="${PORT[C]}" PGUSER=postgres session_open c1 app
session_send c1 "SELECT 'c1 before', sharded_nextval('orders_id') >> 53;"
session_sync c1
grep -q '^c1 before|1$' "$WORK/c1.out" || bad "C did not draw as node 1 before joining: $(cat "$WORK/c1.out" "$WORK/c1.err")"
[ "$(claims_of_1 C)" = "$sysC/app" ] || bad "C does not hold a claim of its own: $(claims_of_1 C)"
echo "RESULT claims of node 1 before C joins: A: $(claims_of_1 A); C: $(claims_of_1 C)"

echo "A subscribes to C, then C to A, both with copy_data = true"
subscribe A C true
all_ready A C || bad "A's subscription to C did not reach 'r' for every table: $(synced A C)"
subscribe C A true
all_ready C A || bad "C's subscription to A did not reach 'r' for every table: $(synced C A)"
echo "RESULT A's tables from C: $(synced A C)"
echo "RESULT C's tables from A: $(synced C A)"

want="$sysA/app $sysC/app"
for n in A C; do
    got="$(claims_of_1 $n)"
    echo "RESULT claims of node 1 on $n, the holder first: $got"
    [ "$got" = "$want" ] || bad "$n does not hold both claims of node 1, A's first: '$got', want '$want'"
done

############################################################################
echo "C, the later claimant, is refused; A and B go on"
later="sharded_seq.node_id 1 is claimed by system $sysA, database \"app\", earlier than by this one (system $sysC, database \"app\")"
for stmt in "SELECT sharded_nextval('orders_id')" "SELECT counter_incr('orders_count')" \
            "INSERT INTO orders (node) VALUES ('C')"; do
    out="$(psql -qXAt -v VERBOSITY=verbose -h 127.0.0.1 -p "${PORT[C]}" -U postgres -d app -c "$stmt" 2>&1 || true)"
    if echo "$out" | grep -qF "ERROR:  55000: $later"; then
        echo "RESULT C, new session, $stmt: $(echo "$out" | grep -m1 ERROR)"
        echo "$out" | grep -q '^HINT:.*a node id no other node uses.*DELETE FROM sharded_seq.node_claims' \
            || bad "no hint on how to resolve: $out"
    else
        bad "C did not refuse '$stmt' with 55000 naming both claims: $out"
    fi
done
for stmt in "SELECT 'c1 after', sharded_nextval('orders_id');" "SELECT 'c1 after', counter_incr('orders_count');"; do
    : >"$WORK/c1.err"
    session_send c1 "$stmt"
    session_sync c1
    if grep -qF "ERROR:  55000: $later" "$WORK/c1.err" && ! grep -q '^c1 after' "$WORK/c1.out"; then
        echo "RESULT C, the session that had checked its claim before A's arrived, $stmt refused (55000)"
    else
        bad "C's session that had checked its claim went on: $stmt: $(cat "$WORK/c1.out" "$WORK/c1.err")"
    fi
done
session_close c1

session_send a1 "SELECT 'a1 after', sharded_nextval('orders_id') >> 53;"
session_sync a1
grep -q '^a1 after|1$' "$WORK/a1.out" && [ ! -s "$WORK/a1.err" ] \
    || bad "A's session that had checked its claim before C's arrived does not draw: $(cat "$WORK/a1.out" "$WORK/a1.err")"
session_close a1
before=$failures
got="$(draws A 2>&1 | tr '\n' ' ')"
[ "$got" = "1 t " ] || bad "A, new session, does not draw: $got"
got="$(draws B 2>&1 | tr '\n' ' ')"
[ "$got" = "2 t " ] || bad "B does not draw: $got"
ok_since $before "A draws (a session from before C's claim arrived, and a new one), B draws"

wait_for C app "SELECT count(*) FROM orders WHERE node = 'A'" 2 || bad "A's orders do not reach C"

############################################################################
echo "the order is the claims' own: C's claim dated a year earlier (as if C's clock were behind)"
before=$failures
PGHOST=127.0.0.1 PGPORT="${PORT[A]}" PGUSER=postgres session_open a2 app
session_send a2 "SELECT 'a2 before', sharded_nextval('orders_id') >> 53;"
session_sync a2
q C -d app -c "UPDATE sharded_seq.node_claims SET claimed_at = claimed_at - interval '1 year'
                WHERE node_id = 1 AND system_identifier = '$sysC'" >/dev/null
wait_for A app "SELECT count(*) FROM sharded_seq.node_claims WHERE system_identifier = '$sysC' AND claimed_at < now() - interval '300 days'" 1 \
    || bad "the new date of C's claim did not reach A"
for n in A C; do
    got="$(claims_of_1 $n)"
    [ "$got" = "$sysC/app $sysA/app" ] || bad "$n does not put C's claim first now: $got"
done
session_send a2 "SELECT 'a2 after', sharded_nextval('orders_id');"
session_sync a2
grep -qF "ERROR:  55000: sharded_seq.node_id 1 is claimed by system $sysC, database \"app\", earlier than by this one (system $sysA, database \"app\")" "$WORK/a2.err" \
    && ! grep -q '^a2 after' "$WORK/a2.out" \
    || bad "A's session that had checked its claim went on: $(cat "$WORK/a2.out" "$WORK/a2.err")"
session_close a2
got="$(psql -qXAt -h 127.0.0.1 -p "${PORT[C]}" -U postgres -d app -c "SELECT sharded_nextval('orders_id') >> 53" 2>&1)"
[ "$got" = 1 ] || bad "C does not draw once its claim is the earlier: $got"
ok_since $before "with C's claim the earlier, on A and on C: A refused (also a session that had checked its claim), C draws"

# nothing stopped an apply worker or a table sync
before=$failures
for n in A C; do
    errs="$(q $n -d app -c "SELECT coalesce(sum(apply_error_count + sync_error_count), 0) FROM pg_stat_subscription_stats")"
    [ "$errs" = 0 ] || bad "$n: pg_stat_subscription_stats counts $errs errors"
    dups="$(grep -c 'duplicate key' "$WORK/$n/server.log" || true)"
    [ "$dups" = 0 ] || { bad "$n: $dups duplicate key errors in the log"; grep -m3 'duplicate key' "$WORK/$n/server.log"; }
done
ok_since $before "apply and sync errors on A and C: none"

[ $fail = 0 ] && echo "claims meet: ok"
exit $fail

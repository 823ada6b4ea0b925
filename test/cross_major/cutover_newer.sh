#!/usr/bin/env bash
# test/cross_major/cutover_newer.sh PUB_CONNINFO < SCHEMA: the newer-major
# side of test/cross_major/cutover_15_to_17.sh, run in the chroot (PG_MAJOR
# set there).  Builds and installs the extension and, in a throwaway
# pg_virtualenv cluster (preloaded, wal_level logical), restores SCHEMA (the
# older pg_dump -s of the publisher), subscribes to publication p at
# PUB_CONNINFO, checks that a draw is refused before the call, runs
# sharded_seq.cutover(), checks rows and counters against the publisher,
# drops the subscription, and has 4 sessions insert 300 orders each.
# Prints "NEW id ticket" for every value the new primary handed out, for the
# older side's check, and "CHECK ok|BAD what" lines.
set -euo pipefail
cd "$(dirname "$0")/../.."
PUB="$1"
if [ -z "${SSQ_CROSS_MAJOR_SIDE:-}" ]; then
    WERROR=1 scripts/setup.sh >/dev/null
    exec env -u PGPORT SSQ_CROSS_MAJOR_SIDE="$PG_MAJOR" pg_virtualenv -t -v "$PG_MAJOR" \
        -o wal_level=logical -o shared_preload_libraries=sharded_seq -o max_worker_processes=16 \
        bash "$0" "$@"
fi
WORK="$(mktemp -d /tmp/ss_cutover.XXXXXX)"
chmod 755 "$WORK"
trap 'rm -rf "$WORK"' EXIT
pub() { psql -qXAt -d "$PUB" "$@"; }
sub() { psql -qXAt -v ON_ERROR_STOP=1 -d app "$@"; }
check() {  # check WHAT GOT EXPECTED
    if [ "$2" = "$3" ]; then echo "CHECK ok $1 ($2)"; else echo "CHECK BAD $1: got '$2', expected '$3'"; fi
}
echo "RESULT PostgreSQL $(pub -c 'SHOW server_version') -> $(psql -qXAt -c 'SHOW server_version')"

psql -qX -v ON_ERROR_STOP=1 -c "CREATE DATABASE app" >/dev/null
psql -qX -v ON_ERROR_STOP=1 -d app >/dev/null
sub -c "CREATE SUBSCRIPTION s CONNECTION '$PUB' PUBLICATION p" >/dev/null 2>&1
for _ in $(seq 1 600); do
    [ "$(sub -c "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate NOT IN ('r', 's')")" = 0 ] && break
    sleep 0.2
done

# the skipped call: refused, naming the call
err="$(sub -c "SELECT sharded_nextval('orders_id')" 2>&1 || true)"
if [[ "$err" == *"arrived by logical replication"* && "$err" == *"sharded_seq.cutover('subscription_name')"* ]]; then
    echo "CHECK ok a draw before the call is refused"
else
    echo "CHECK BAD a draw before the call: $err"
fi

# the call, while the older side's writers run
sub -c "SELECT sequence_name || ' ' || old_high_water || ' -> ' || new_start FROM sharded_seq.cutover('s')" |
    sed 's/^/RESULT cutover: /'
err="$(pub -c "SELECT counter_incr('orders_exact')" 2>&1 || true)"
[[ "$err" == *"stopped by a cutover"* ]] && echo "CHECK ok the old primary refuses increments" ||
    echo "CHECK BAD the old primary took an increment: $err"
check "rows" "$(sub -c 'SELECT count(*), sum(id), sum(ticket) FROM orders')" \
    "$(pub -c 'SELECT count(*), sum(id), sum(ticket) FROM orders')"
rows="$(sub -c 'SELECT count(*) FROM orders')"
for c in orders_exact orders_buf; do
    check "$c on $PG_MAJOR" "$(sub -c "SELECT counter_value('$c')")" "$rows"
    check "$c on the old primary" "$(pub -c "SELECT counter_value('$c')")" "$rows"
done
sub -c "DROP SUBSCRIPTION s" >/dev/null

# writers on the new primary
pids=()
for i in 1 2 3 4; do
    sub -c "INSERT INTO orders (w) SELECT -$i FROM generate_series(1, 300) RETURNING 'NEW ' || id || ' ' || ticket" \
        -c "SELECT counter_incr('orders_exact', 300), counter_incr('orders_buf', 300)" >"$WORK/new.$i" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
grep -h '^NEW ' "$WORK"/new.*
check "rows on $PG_MAJOR after its writers" "$(sub -c 'SELECT count(*) FROM orders')" "$((rows + 1200))"
check "counters on $PG_MAJOR after its writers" \
    "$(sub -c "SELECT counter_value('orders_exact') = count(*) AND counter_value('orders_buf') = count(*) FROM orders")" t

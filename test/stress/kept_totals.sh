#!/usr/bin/env bash
# Kept totals where rows change without this extension's marks (preloaded):
#   1. a prepared transaction that survives a restart (the words start again
#      at zero) is committed by COMMIT PREPARED: a session that kept the
#      total must see its increment;
#   2. on a hot standby, WAL replay changes rows: a standby session must see
#      every increment the primary commits.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"
WORK="$(mktemp -d /tmp/ss_kept.XXXXXX)"
chmod 755 "$WORK"
STANDBY=""
trap '[ -n "$STANDBY" ] && as_pg "$PGBIN/pg_ctl" -D "$STANDBY" -m immediate stop >/dev/null 2>&1; cluster_destroy >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
fail() { echo "FAILED: $*"; exit 1; }
q() { psql -qXAt -v ON_ERROR_STOP=1 -d stress -c "$1"; }
last_value() { session_sync "$1"; grep -v "^sync-" "$WORK/$1.out" | tail -n 1; }
cluster_create "$WORK/pg"
cat >>"$PGDATA/postgresql.conf" <<'CONF'
shared_preload_libraries = 'sharded_seq'
wal_level = replica
CONF
echo "host replication all 127.0.0.1/32 trust" >>"$PGDATA/pg_hba.conf"
cluster_start
db_create stress

echo "== 1. COMMIT PREPARED of a transaction from before a restart"
q "SELECT sharded_seq.create_counter('c', shards => 4)" >/dev/null
q "SELECT counter_incr('c', 1)" >/dev/null
psql -qX -v ON_ERROR_STOP=1 -d stress -c "BEGIN" -c "SELECT counter_incr('c', 100)" -c "PREPARE TRANSACTION 'p1'" >/dev/null
as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$CLUSTER_DIR/server.log" -m fast -w restart >/dev/null
session_open R
session_send R "SELECT counter_value('c'); SELECT counter_value('c'); SELECT counter_value('c'); SELECT counter_value('c');"
[ "$(last_value R)" = 1 ] || fail "R reads $(last_value R) before COMMIT PREPARED, not 1"
q "COMMIT PREPARED 'p1'" >/dev/null
q "SELECT txid_current()" >/dev/null
session_send R "SELECT counter_value('c');"
got="$(last_value R)"
echo "RESULT after COMMIT PREPARED of a transaction prepared before a restart, R reads $got (want 101)"
[ "$got" = 101 ] || fail "a kept total hid a prepared transaction's increment"
session_close R

echo "== 2. a hot standby"
STANDBY="$WORK/standby"
mkdir -m 700 "$STANDBY"
[ "$(id -u)" = 0 ] && chown postgres: "$STANDBY"
as_pg "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "$PGPORT" -U postgres -D "$STANDBY" -R -X stream >/dev/null
SPORT="$(free_port)"
cat >>"$STANDBY/postgresql.conf" <<CONF
port = $SPORT
hot_standby = on
CONF
as_pg "$PGBIN/pg_ctl" -D "$STANDBY" -l "$CLUSTER_DIR/standby.log" -w start >/dev/null
PRIMARY_PORT="$PGPORT"
export PGPORT="$SPORT"
session_open S
export PGPORT="$PRIMARY_PORT"
session_send S "SELECT counter_value('c'); SELECT counter_value('c'); SELECT counter_value('c'); SELECT counter_value('c');"
[ "$(last_value S)" = 101 ] || fail "the standby session reads $(last_value S), not 101"
for want in 201 301; do
    q "SELECT counter_incr('c', 100)" >/dev/null
    lsn="$(q "SELECT pg_current_wal_lsn()")"
    for _ in $(seq 1 100); do
        [ "$(psql -qXAt -p "$SPORT" -d stress -c "SELECT pg_last_wal_replay_lsn() >= '$lsn'")" = t ] && break
        sleep 0.1
    done
    session_send S "SELECT counter_value('c');"
    got="$(last_value S)"
    echo "RESULT after an increment on the primary, the standby session reads $got (want $want)"
    [ "$got" = "$want" ] || fail "a standby session kept a total that replay had changed"
done
session_close S
echo "kept totals test passed"

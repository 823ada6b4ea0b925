#!/usr/bin/env bash
# E4 across ALTER EXTENSION ... UPDATE, from every earlier version: for every
# version X below the control file's default_version that the install
# scripts provide (the base sharded_seq--1.0.sql and each version its update
# chain reaches: install_versions in scripts/lib.sh), install version X, use
# sequences (database and memcached tier) and counters (exact and buffered)
# from several sessions, with a real memcached on a loopback port, then
# ALTER EXTENSION sharded_seq UPDATE.
# Every counter total must be kept, no value may repeat, every later value
# must be above every value its shard handed out before (for the one-shard
# memcached tier: above every earlier value), and the extension must be at
# default_version.
# With no earlier version there is nothing to check: the test says so and
# exits 77 (skipped, counted neither as passed nor as failed).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"

default="$(sed -n "s/^default_version *= *'\(.*\)'/\1/p" "$ROOT_DIR/sharded_seq.control")"
[ -n "$default" ] || { echo "no default_version in sharded_seq.control"; exit 1; }
older=()
versions="$(install_versions)" || exit 1
for v in $versions; do              # oldest first
    [ "$v" = "$default" ] && break
    older+=("$v")
done
[[ " $(echo $versions) " == *" $default "* ]] || { echo "the install scripts do not provide $default: $(echo $versions)"; exit 1; }
if [ ${#older[@]} = 0 ]; then
    echo "SKIP no version older than the default $default has install scripts: nothing to update from"
    exit 77
fi
echo "default_version $default; updating from: ${older[*]}"

WORK="$(mktemp -d /tmp/ss_update.XXXXXX)"
chmod 755 "$WORK"
trap 'memcached_kill; cluster_destroy >/dev/null 2>&1; rm -rf "$WORK"' EXIT
MC_PORT="$(free_port)"
memcached_start "$MC_PORT"
cluster_create "$WORK/pg"
cluster_start
psql -qX -v ON_ERROR_STOP=1 -d postgres >/dev/null <<SQL
LOAD 'sharded_seq';
ALTER SYSTEM SET sharded_seq.memcached_servers = '127.0.0.1:$MC_PORT';
ALTER SYSTEM SET sharded_seq.counter_flush_interval = 1;
SELECT pg_reload_conf();
SQL

SESSIONS=4
# increments DB: session i adds i to each counter 25 times (committed), and
# 1000 in a rolled-back transaction, which must not count.
increments() {
    local db="$1" pids=() i
    for i in $(seq 1 $SESSIONS); do
        psql -qX -v ON_ERROR_STOP=1 -d "$db" >/dev/null 2>"$WORK/$db.inc.$i.err" <<SQL &
SELECT counter_incr('exact_c', $i), counter_incr('buf_c', $i) FROM generate_series(1, 25);
BEGIN;
SELECT counter_incr('exact_c', 1000), counter_incr('buf_c', 1000);
ROLLBACK;
SQL
        pids+=($!)
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    if [ $rc != 0 ]; then cat "$WORK/$db".inc.*.err; return 1; fi
}
totals() {
    psql -qXAt -v ON_ERROR_STOP=1 -d "$1" -c \
        "SELECT string_agg(name || '=' || counter_value(name), ' ' ORDER BY name) FROM sharded_seq.counters"
}

# each session adds 25 * i: 25 * (1 + 2 + 3 + 4) = 250 per round
expected_total() { echo $(( 25 * SESSIONS * (SESSIONS + 1) / 2 * $1 )); }

for v in "${older[@]}"; do
    db="upd_${v//[^a-zA-Z0-9]/_}"
    echo "==> from $v to $default"
    psql -qX -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE $db" >/dev/null
    # memcached write-behind: 'buffered' up to 1.2, 'memcached' from 1.3 (whose
    # 'buffered' is shared memory and needs a preloaded library)
    case "$v" in 1.0|1.1|1.2) wb_mode=buffered ;; *) wb_mode=memcached ;; esac
    psql -qX -v ON_ERROR_STOP=1 -d "$db" >/dev/null <<SQL
CREATE EXTENSION sharded_seq VERSION '$v';
SELECT sharded_seq.create_sequence('db_seq', shards => 4, block => 20);
SELECT sharded_seq.create_sequence('db1_seq', shards => 1, block => 20);
SELECT sharded_seq.create_sequence('mc_seq', tier => 'memcached', block => 400);
SELECT sharded_seq.create_counter('exact_c', shards => 4);
SELECT sharded_seq.create_counter('buf_c', shards => 2, mode => '$wb_mode');
CREATE TABLE drawn (seq text, v bigint, phase text);
SQL
    [ "$(psql -qXAt -d "$db" -c "SELECT extversion FROM pg_extension WHERE extname = 'sharded_seq'")" = "$v" ]
    draw_sessions "$db" before $SESSIONS db_seq db1_seq mc_seq
    increments "$db"
    want="buf_c=$(expected_total 1) exact_c=$(expected_total 1)"
    before="$(totals "$db")"
    echo "RESULT $v before the update: $before; $(psql -qXAt -d "$db" -c "SELECT count(*) FROM drawn") values drawn"
    [ "$before" = "$want" ] || { echo "totals before the update are $before, not $want"; exit 1; }

    psql -qX -v ON_ERROR_STOP=1 -d "$db" -c "ALTER EXTENSION sharded_seq UPDATE" >/dev/null
    now="$(psql -qXAt -d "$db" -c "SELECT extversion FROM pg_extension WHERE extname = 'sharded_seq'")"
    echo "RESULT $v updated to $now"
    [ "$now" = "$default" ]
    after="$(totals "$db")"
    echo "RESULT $v after the update: $after"
    [ "$after" = "$before" ] || { echo "totals changed across the update: $before -> $after"; exit 1; }
    # 1.0-1.2's 'buffered' was the memcached write-behind: it keeps that meaning
    modes="$(psql -qXAt -d "$db" -c "SELECT string_agg(name || ':' || mode, ' ' ORDER BY name) FROM sharded_seq.counters")"
    echo "RESULT $v modes after the update: $modes"
    [ "$modes" = "buf_c:memcached exact_c:exact" ] || { echo "unexpected modes: $modes"; exit 1; }

    # later values: none repeated, and each above every value handed out
    # before by the same shard (block k of shard i starts at
    # base + (k * shards + i) * block, so a value's shard is known).  With
    # one shard that is every earlier value; values of different shards
    # interleave by design, so a later value may lie below an earlier one
    # from another shard.
    draw_sessions "$db" after $SESSIONS db_seq db1_seq mc_seq
    check="$(check_drawn "$db")"
    echo "RESULT $v values: $check"
    [[ "$check" == *" OK" ]]
    [ "$(psql -qXAt -d "$db" -c "SELECT count(DISTINCT seq) FROM drawn")" = 3 ]

    # counters keep counting from the kept totals
    increments "$db"
    want="buf_c=$(expected_total 2) exact_c=$(expected_total 2)"
    final="$(totals "$db")"
    echo "RESULT $v after more increments: $final"
    [ "$final" = "$want" ] || { echo "totals are $final, not $want"; exit 1; }

    # counters from before keep their layout; new ones are adaptive, and
    # maintain() works on the updated schema without changing a total
    layout="$(psql -qXAt -v ON_ERROR_STOP=1 -d "$db" <<'SQL'
SELECT counter_incr('new_c');
SELECT string_agg(name || ':' || shards || ':' || adaptive, ' ' ORDER BY name) FROM sharded_seq.counters;
SELECT 'maintain ' || (sharded_seq.maintain()).compacted;
SQL
)"
    echo "RESULT $v layouts after the update: ${layout//$'\n'/ }"
    [ "$(echo "$layout" | sed -n 2p)" = "buf_c:2:false exact_c:4:false new_c:1:true" ] || { echo "unexpected layouts"; exit 1; }
    [ "$(totals "$db")" = "$want new_c=1" ] || { echo "totals changed after maintain(): $(totals "$db")"; exit 1; }
done

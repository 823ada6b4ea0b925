#!/usr/bin/env bash
# A build without libmemcached (make MEMCACHED=0): it links no libmemcached,
# a postgresql.conf that names memcached servers still starts, sequences and
# exact and buffered counters work, the memcached tier and mode (and the
# servers setting) are refused with 0A000 and a hint naming the build option,
# objects already in memcached's tier or mode (as a restore from a memcached
# build leaves them) keep working through the database, but a memcached
# counter is neither set nor moved out of its mode (amounts memcached may hold
# would count on top on a build with memcached), and make installcheck
# passes (leaving out the pg_regress files that make memcached objects).
#
# The tree is built into a copy of the server's installation (PostgreSQL finds
# its libraries and extension files relative to its own binaries; as
# bench/against.sh does), so the host's installation keeps its build.  Run on
# the host's PostgreSQL 15 only: one major is enough for a build option.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
MAJOR="${PG_MAJOR:-15}"
if [ "$MAJOR" != 15 ]; then
    echo "SKIP the build without libmemcached is tested on PostgreSQL 15 (the host) only"
    exit 77
fi
HOST_BIN="/usr/lib/postgresql/$MAJOR/bin"
unset PGHOST PGPORT PGUSER PGDATABASE PGPASSWORD PGSYSCONFDIR PG_CLUSTER_CONF_ROOT

as_pg() {
    if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

WORK="$(mktemp -d /tmp/ss_nomemcached.XXXXXX)"
chmod 755 "$WORK"
INST="$WORK/inst"
BIN="$INST/usr/lib/postgresql/$MAJOR/bin"
DATA="$WORK/data"
cleanup() {
    [ ! -f "$DATA/postmaster.pid" ] || as_pg "$BIN/pg_ctl" -D "$DATA" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAILED: $*"; exit 1; }

# this tree as it is, without what a build leaves
mkdir "$WORK/src"
tar -C "$SRC" --exclude=./.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
    --exclude=./results --exclude=./log --exclude=./tmp_check --exclude=./output_iso \
    --exclude=./.wait_points --exclude=./.memcached --exclude=./debian -cf - . | tar -C "$WORK/src" -xf -
make -s -C "$WORK/src" -j2 MEMCACHED=0 WERROR=1 with_llvm=no PG_CONFIG="$HOST_BIN/pg_config" >"$WORK/build.log" 2>&1 ||
    { cat "$WORK/build.log"; fail "make MEMCACHED=0"; }
make -s -C "$WORK/src" install MEMCACHED=0 with_llvm=no PG_CONFIG="$HOST_BIN/pg_config" DESTDIR="$INST" >>"$WORK/build.log" 2>&1 ||
    { cat "$WORK/build.log"; fail "make install"; }
# the server itself, around it; the host's bitcode of the extension is not this build's
mkdir -p "$INST/usr/lib/postgresql" "$INST/usr/share/postgresql"
cp -an "/usr/lib/postgresql/$MAJOR" "$INST/usr/lib/postgresql/"
cp -an "/usr/share/postgresql/$MAJOR" "$INST/usr/share/postgresql/"
rm -rf "$INST/usr/lib/postgresql/$MAJOR/lib/bitcode/sharded_seq" "$INST/usr/lib/postgresql/$MAJOR/lib/bitcode/sharded_seq.index.bc"
LIB="$INST/usr/lib/postgresql/$MAJOR/lib/sharded_seq.so"

linked="$(ldd "$LIB" | grep -c libmemcached || true)"
calls="$(nm -D --undefined-only "$LIB" | grep -c ' memcached_' || true)"
echo "RESULT libmemcached in ldd: $linked; libmemcached functions the library calls: $calls"
[ "$linked" = 0 ] && [ "$calls" = 0 ] || fail "the MEMCACHED=0 build uses libmemcached"

# a preloaded cluster whose postgresql.conf names a memcached server
mkdir "$DATA"
[ "$(id -u)" != 0 ] || chown postgres: "$WORK" "$DATA"
as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 --no-sync >"$WORK/initdb.log" 2>&1 ||
    { cat "$WORK/initdb.log"; fail initdb; }
PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
cat >>"$DATA/postgresql.conf" <<CONF
port = $PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK'
max_prepared_transactions = 10
jit = off
shared_preload_libraries = 'sharded_seq'
sharded_seq.memcached_servers = '127.0.0.1:11211'
CONF
start() { as_pg "$BIN/pg_ctl" -D "$DATA" -l "$WORK/server.log" -w -t 60 start >/dev/null || { tail -n 20 "$WORK/server.log"; fail "the server did not start"; }; }
stop() { as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null; }
start
pid="$(head -n 1 "$DATA/postmaster.pid")"
mapped="$(grep -o '/[^ ]*sharded_seq\.so' "/proc/$pid/maps" | head -n 1)"
[ "$mapped" = "$LIB" ] || fail "the server mapped $mapped, not $LIB"
export PGHOST=127.0.0.1 PGPORT="$PORT" PGUSER=postgres PGDATABASE=postgres
q() { "$BIN/psql" -qXAt -v ON_ERROR_STOP=1 "$@"; }

grep -q 'WARNING:  memcached servers cannot be set: sharded_seq was built without libmemcached' "$WORK/server.log" ||
    { cat "$WORK/server.log"; fail "no warning for the memcached server in postgresql.conf"; }
grep -q 'HINT:  Rebuild sharded_seq with libmemcached-dev installed (make MEMCACHED=1).' "$WORK/server.log" ||
    fail "the warning has no hint"
[ -z "$(q -c 'SHOW sharded_seq.memcached_servers')" ] || fail "memcached_servers is not empty"
echo "RESULT a postgresql.conf naming a memcached server: the server starts, with a warning; the setting stays empty"

q >/dev/null <<'SQL'
CREATE EXTENSION sharded_seq;
SELECT sharded_seq.create_sequence('ids');
SELECT sharded_seq.create_sequence('per_session', cache => 'session');
SELECT sharded_seq.create_counter('exact_c');
SELECT sharded_seq.create_counter('buffered_c', mode => 'buffered');
-- what a restore of a memcached build's dump leaves: config rows in the memcached tier and mode
SELECT sharded_seq.create_sequence('restored', shards => 1, block => 10, cache => 'session');
SELECT sharded_seq.create_counter('restored_c');
UPDATE sharded_seq.sequence_config SET tier = 'memcached' WHERE name = 'restored';
UPDATE sharded_seq.counter_config SET mode = 'memcached' WHERE name = 'restored_c';
SQL
stop
start

# draws: n distinct values, increasing in the session
draws() {
    q -c "SELECT count(DISTINCT v) = $2 AND bool_and(v > p) FROM
            (SELECT v, lag(v, 1, 0::bigint) OVER (ORDER BY i) p
               FROM (SELECT i, sharded_nextval('$1') v FROM generate_series(1, $2) i) d) s"
}
for s in ids per_session restored; do
    [ "$(draws $s 2000)" = t ] || fail "draws from $s"
    [ "$(draws $s 2000)" = t ] || fail "draws from $s in a second session"
done
for c in exact_c buffered_c restored_c; do
    for i in 1 2 3; do q -c "SELECT counter_incr('$c', 7)" >/dev/null; done
done
q -c "SELECT sharded_seq.flush_counters()" >/dev/null
totals="$(q -c "SELECT string_agg(name || '=' || counter_value(name), ' ' ORDER BY name) FROM sharded_seq.counters")"
[ "$totals" = "buffered_c=21 exact_c=21 restored_c=21" ] || fail "counter totals: $totals"
# a 'memcached' counter's amounts may still be in memcached (a data
# directory a build with libmemcached used): setting it here, or moving it out
# of the mode, would let a build with memcached count them on top later
for call in "sharded_seq.set_counter('restored_c', 100)" "sharded_seq.alter_counter('restored_c', mode => 'exact')"; do
    out="$("$BIN/psql" -qXAt -v VERBOSITY=verbose -c "SELECT $call" 2>&1 || true)"
    echo "$out" | grep -q "^ERROR:  0A000: cannot [a-z ]* counter \"restored_c\" (mode 'memcached'): sharded_seq was built without libmemcached" ||
        fail "$call gave: $out"
    echo "$out" | grep -q "^HINT:  On a build with libmemcached, move it to mode 'exact' with sharded_seq.alter_counter(), which flushes memcached's amounts, before switching builds\.$" ||
        fail "$call has no hint: $out"
done
[ "$(q -c "SELECT mode || ' ' || counter_value(name) FROM sharded_seq.counters WHERE name = 'restored_c'")" = "memcached 21" ] ||
    fail "a refused set or move changed restored_c"
echo "RESULT draws of 2 x 2000 from a node-cached, a session-cached and a restored memcached-tier sequence; counters $totals; set_counter of the memcached counter and moving it out of the mode refused (0A000, with the hint)"

# refused: 0A000, a lower-case message and the build option in the hint
refuses() {
    local out
    out="$("$BIN/psql" -qXAt -v VERBOSITY=verbose -c "$1" 2>&1 || true)"
    echo "$out" | grep -q "^ERROR:  0A000: $2" || fail "$1 gave: $out"
    echo "$out" | grep -q "^HINT:  Rebuild sharded_seq with libmemcached-dev installed (make MEMCACHED=1)\.$" ||
        fail "$1 has no hint naming the build option: $out"
}
refuses "SELECT sharded_seq.create_sequence('m', tier => 'memcached')" "tier 'memcached' is not available: sharded_seq was built without libmemcached"
refuses "SELECT sharded_seq.alter_sequence('ids', tier => 'memcached')" "tier 'memcached' is not available"
refuses "SELECT sharded_seq.create_counter('m', mode => 'memcached')" "mode 'memcached' is not available: sharded_seq was built without libmemcached"
refuses "SELECT sharded_seq.alter_counter('exact_c', mode => 'memcached')" "mode 'memcached' is not available"
refuses "SET sharded_seq.memcached_servers = '127.0.0.1:11211'" "memcached servers cannot be set"
refuses "ALTER SYSTEM SET sharded_seq.memcached_servers = '127.0.0.1:11211'" "memcached servers cannot be set"
[ "$(q -c "SELECT count(*) FROM sharded_seq.sequences WHERE tier = 'memcached'") $(q -c "SELECT count(*) FROM sharded_seq.counters WHERE mode = 'memcached'")" = "1 1" ] ||
    fail "a refused call left an object behind"
q -c "SET sharded_seq.memcached_servers = ''" >/dev/null
echo "RESULT tier and mode 'memcached' and the servers setting refused (0A000, with the hint)"

# what shows memcached works, and shows nothing of it (flushes count buffered counters' too)
shown="$(q -c 'SELECT * FROM sharded_seq.memcached_stats WHERE hits + rebuilds + fallbacks + errors > 0' \
           -c 'SELECT * FROM sharded_seq.memcached_servers()')"
[ -z "$shown" ] || fail "memcached_stats or memcached_servers() shows memcached at work: $shown"
q -c "SELECT sharded_seq.alter_sequence('restored', tier => 'database')" >/dev/null
[ "$(draws restored 100)" = t ] && [ "$(q -c "SELECT counter_incr('restored_c', 1)")" = 22 ] ||
    fail "the restored objects after the sequence left memcached"
echo "RESULT memcached_stats without memcached events, memcached_servers() empty; the restored sequence moved to tier 'database', the counter still counts in mode 'memcached'"

# make installcheck, in a cluster without preloading (as the runner's)
sed -i '/^shared_preload_libraries\|^sharded_seq\.memcached_servers/d' "$DATA/postgresql.conf"
stop
start
status=0
make -C "$WORK/src" installcheck MEMCACHED=0 PG_CONFIG="$HOST_BIN/pg_config" >"$WORK/regress.log" 2>&1 || status=$?
if [ $status != 0 ]; then
    cat "$WORK/regress.log"
    head -n 100 "$WORK/src/regression.diffs" 2>/dev/null || true
    fail "make installcheck"
fi
ran="" left=""
for f in "$WORK"/src/sql/*.sql; do
    t="$(basename "$f" .sql)"
    if grep -Eq "^(ok|test) .*\b$t +\.\.\. ok|^ok +[0-9]+ +[-+] +$t " "$WORK/regress.log"; then
        ran+=" $t"
    else
        grep -q memcached "$f" || fail "make installcheck left out $t, which uses no memcached"
        left+=" $t"
    fi
done
[ -n "$ran" ] || fail "make installcheck ran nothing"
echo "RESULT make installcheck passed:$ran (left out, they make memcached objects:$left)"

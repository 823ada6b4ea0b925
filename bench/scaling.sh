#!/usr/bin/env bash
# bench/scaling.sh [SECONDS] [CLIENT_LIST]: scaling curves.  pgbench tps of
# each workload below at each client count of CLIENT_LIST (default
# "1 2 4 8 16 32 64"), SECONDS per point (default 5), in one run on one
# throwaway cluster (preloaded, as the shared-memory mode needs) and memcached:
#
#   - SELECT 1;
#   - nextval on a native sequence with CACHE 1000;
#   - sharded_nextval('s') on a sequence from create_sequence('s') (from
#     1.5 on, drawn through the node cache), and, from 1.5 on,
#     sharded_nextval('s_session') on one with cache => 'session';
#   - UPDATE of one hot row, and of a random one of 16 slot rows;
#   - counter_incr in mode 'exact', 'buffered' (shared memory) and
#     'memcached'.  Version 1.2 calls the memcached write-behind mode
#     'buffered' and has no shared-memory mode; the script finds out which
#     modes create_counter accepts and prints n/a for a workload it cannot
#     set up.
#
# Client counts are the outer loop, so drift on a noisy machine hits every
# workload of one column alike.  Every point starts after VACUUM and
# CHECKPOINT.  pgbench runs -n -M prepared with -j min(clients, 2): this is a
# 2-core machine, and more pgbench threads than cores only compete with the
# server.  At SECONDS=5, the 63 points take about 8 minutes.
#
# Writes bench/results/scaling.md (the markdown table, also printed on
# stdout), scaling.dat (the same numbers for gnuplot), scaling.gp and
# scaling.png (tps against clients, log2 x axis; gnuplot-nox is installed if
# missing).  Benchmarks are not tests: nothing here asserts a timing.
set -euo pipefail
cd "$(dirname "$0")/.."
T="${1:-5}"
CLIENTS="$(echo "${2:-1 2 4 8 16 32 64}" | tr ',' ' ')"
case "$T" in ''|*[!0-9]*|0) echo "SECONDS must be a positive integer, not '$T'" >&2; exit 2 ;; esac
MAXC=0 MINC=""
for c in $CLIENTS; do
    case "$c" in ''|*[!0-9]*|0) echo "client counts must be positive integers, not '$c'" >&2; exit 2 ;; esac
    if [ "$c" -gt "$MAXC" ]; then MAXC=$c; fi
    if [ -z "$MINC" ] || [ "$c" -lt "$MINC" ]; then MINC=$c; fi
done
[ "$MAXC" -gt 0 ] || { echo "no client counts given" >&2; exit 2; }
RESULTS="$PWD/bench/results"
mkdir -p "$RESULTS"

# gnuplot draws the picture; the bench needs it, the tests do not, so it is
# installed here rather than by scripts/setup.sh.  Without it the run still
# gives its table.
if ! command -v gnuplot >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    echo "==> installing gnuplot-nox" >&2
    { $SUDO apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null; } ||
        echo "warning: could not install gnuplot-nox; there will be no picture" >&2
fi

[ -n "${SKIP_SETUP:-}" ] || scripts/setup.sh >/dev/null
source bench/lib.sh
q() { psql -qXAt -v ON_ERROR_STOP=1 -d bench "$@"; }

MC_PORT="$(free_port)"
memcached_start "$MC_PORT" >/dev/null
bench_cluster "$(mktemp -d /tmp/ss_scaling.XXXXXX)"
trap 'memcached_kill; cluster_destroy >/dev/null 2>&1; rm -rf "$WORK"' EXIT

# Preload (the shared-memory mode needs it) and room for the largest client
# count, pgbench's own connection and the psql between points: both need a
# restart.  cluster_create sets max_connections = 100.
MAX_CONN=$(( MAXC + 20 > 100 ? MAXC + 20 : 100 ))
q -c "ALTER SYSTEM SET shared_preload_libraries = 'sharded_seq'" \
  -c "ALTER SYSTEM SET max_connections = $MAX_CONN" \
  -c "LOAD 'sharded_seq'" \
  -c "ALTER SYSTEM SET sharded_seq.memcached_servers = '127.0.0.1:$MC_PORT'" >/dev/null
cluster_stop
cluster_start || { echo "the cluster did not restart with sharded_seq preloaded:" >&2; tail -20 "$CLUSTER_DIR/server.log" >&2; exit 1; }
[ "$(q -c 'SHOW shared_preload_libraries')" = sharded_seq ] || { echo "sharded_seq is not preloaded" >&2; exit 1; }
[ "$(q -c 'SHOW max_connections')" -ge $(( MAXC + 2 )) ] || { echo "max_connections is too low for $MAXC clients" >&2; exit 1; }

EXTVERSION="$(q -c "SELECT extversion FROM pg_extension WHERE extname = 'sharded_seq'")"
# From 1.3 on, 'buffered' is the shared-memory mode and 'memcached' the
# memcached write-behind mode; before, 'buffered' was the memcached one.
NEW_NAMES="$(q -c "SELECT coalesce((regexp_match(extversion, '^(\d+)\.(\d+)'))::int[] >= '{1,3}', false)
                     FROM pg_extension WHERE extname = 'sharded_seq'")"

psql -qX -v ON_ERROR_STOP=1 -d bench >/dev/null <<SQL
CREATE SEQUENCE s_cache1000 CACHE 1000;
SELECT sharded_seq.create_sequence('s');
CREATE TABLE hot (id int PRIMARY KEY, n bigint) WITH (fillfactor = 50);
INSERT INTO hot VALUES (1, 0);
CREATE TABLE slots (id int PRIMARY KEY, n bigint) WITH (fillfactor = 50);
INSERT INTO slots SELECT g, 0 FROM generate_series(1, 16) g;
SQL

# try SQL: run SQL, true if it worked (its error goes to stderr, indented)
try() {
    local err
    if err=$(q -c "$1" 2>&1 >/dev/null); then return 0; fi
    echo "    ($1: ${err//$'\n'/ })" >&2
    return 1
}
echo "==> which counter modes does sharded_seq $EXTVERSION accept?" >&2
try "SELECT sharded_seq.create_counter('c_exact', mode => 'exact')" && C_EXACT=1 || C_EXACT=""
MC_MODE=""
if try "SELECT sharded_seq.create_counter('c_memcached', mode => 'memcached')"; then
    MC_MODE=memcached
    NEW_NAMES=t
elif [ "$NEW_NAMES" != t ] && try "SELECT sharded_seq.create_counter('c_memcached', mode => 'buffered')"; then
    MC_MODE=buffered
fi
# 1.5: the node cache is the default; per-session blocks are cache 'session'
try "SELECT sharded_seq.create_sequence('s_session', cache => 'session')" && SESSION_CACHE=1 || SESSION_CACHE=""
BUF_MODE=""
if [ "$NEW_NAMES" = t ] && try "SELECT sharded_seq.create_counter('c_buffered', mode => 'buffered')"; then
    BUF_MODE=buffered
fi

# Workloads: key, pgbench script, label for the table, title for the picture.
ORDER="select1 nextval sharded_nextval sharded_nextval_session hot_row slots16 counter_exact counter_buffered counter_memcached"
declare -A W LABEL TITLE TPS NA
W[select1]="SELECT 1;"
W[nextval]="SELECT nextval('s_cache1000');"
W[sharded_nextval]="SELECT sharded_nextval('s');"
W[sharded_nextval_session]="SELECT sharded_nextval('s_session');"
W[hot_row]="UPDATE hot SET n = n + 1 WHERE id = 1;"
W[slots16]=$'\\set r random(1, 16)\nUPDATE slots SET n = n + 1 WHERE id = :r;'
W[counter_exact]="SELECT counter_incr('c_exact');"
W[counter_buffered]="SELECT counter_incr('c_buffered');"
W[counter_memcached]="SELECT counter_incr('c_memcached');"
LABEL[select1]="\`SELECT 1\`"
LABEL[nextval]="\`nextval\`, native sequence CACHE 1000"
LABEL[sharded_nextval]="\`sharded_nextval('s')\`"
[ -n "$SESSION_CACHE" ] && LABEL[sharded_nextval]="\`sharded_nextval('s')\`, cache 'node' (the default)"
LABEL[sharded_nextval_session]="\`sharded_nextval('s_session')\`, cache 'session'"
LABEL[hot_row]="\`UPDATE\` one hot row"
LABEL[slots16]="\`UPDATE\` a random one of 16 slot rows"
LABEL[counter_exact]="\`counter_incr\`, mode 'exact'"
LABEL[counter_buffered]="\`counter_incr\`, mode 'buffered' (shared memory)"
LABEL[counter_memcached]="\`counter_incr\`, mode 'memcached'"
[ "$MC_MODE" = buffered ] && LABEL[counter_memcached]="\`counter_incr\`, memcached write-behind (mode 'buffered' in $EXTVERSION)"
TITLE[select1]="SELECT 1"
TITLE[nextval]="nextval, CACHE 1000"
TITLE[sharded_nextval]="sharded_nextval"
[ -n "$SESSION_CACHE" ] && TITLE[sharded_nextval]="sharded_nextval, cache node"
TITLE[sharded_nextval_session]="sharded_nextval, cache session"
TITLE[hot_row]="UPDATE one hot row"
TITLE[slots16]="UPDATE 1 of 16 slot rows"
TITLE[counter_exact]="counter_incr exact"
TITLE[counter_buffered]="counter_incr buffered (shared memory)"
TITLE[counter_memcached]="counter_incr memcached"
# one look per workload whichever of them run: the anchors grey and dashed
declare -A STYLE=(
    [select1]="lc rgb '#555555' dt 2 pt 1"
    [nextval]="lc rgb '#1f77b4' pt 2"
    [sharded_nextval]="lc rgb '#ff7f0e' pt 7"
    [sharded_nextval_session]="lc rgb '#bcbd22' pt 3"
    [hot_row]="lc rgb '#8c564b' dt 4 pt 4"
    [slots16]="lc rgb '#9467bd' dt 4 pt 5"
    [counter_exact]="lc rgb '#2ca02c' pt 6"
    [counter_buffered]="lc rgb '#d62728' pt 9"
    [counter_memcached]="lc rgb '#17becf' pt 8")
[ -n "$C_EXACT" ] || NA[counter_exact]=1
[ -n "$SESSION_CACHE" ] || NA[sharded_nextval_session]=1
[ -n "$BUF_MODE" ] || NA[counter_buffered]=1
[ -n "$MC_MODE" ] || NA[counter_memcached]=1

# Every workload that was set up must also run once under pgbench, or it is
# n/a too (a mode may be accepted and still fail, say without memcached).
for w in $ORDER; do
    printf '%s\n' "${W[$w]}" >"$WORK/$w.sql"
    [ -z "${NA[$w]:-}" ] || continue
    if ! pgbench -n -M prepared -c 1 -t 1 -f "$WORK/$w.sql" bench >"$WORK/$w.check" 2>&1; then
        echo "    ($w does not run: $(grep -m1 -i error "$WORK/$w.check" || tail -1 "$WORK/$w.check"))" >&2
        NA[$w]=1
    fi
done
for w in $ORDER; do
    if [ -n "${NA[$w]:-}" ]; then echo "    $w: n/a" >&2; else echo "    $w: ok" >&2; fi
done

npoints=0
for w in $ORDER; do [ -n "${NA[$w]:-}" ] || npoints=$((npoints + 1)); done
npoints=$(( npoints * $(echo $CLIENTS | wc -w) ))
echo "==> $npoints points of ${T}s, about $(( (npoints * (T + 2) + 59) / 60 )) minutes" >&2

for c in $CLIENTS; do
    j=$(( c < 2 ? c : 2 ))
    for w in $ORDER; do
        if [ -n "${NA[$w]:-}" ]; then TPS[$w.$c]="n/a"; continue; fi
        # every point starts from the same clean state: write-behind
        # amounts moved to their rows, dead rows gone, dirty pages written
        q -c "SELECT sharded_seq.flush_counters()" >/dev/null 2>&1 || true
        q -c "VACUUM" -c "CHECKPOINT" >/dev/null
        if pgbench -n -M prepared -j "$j" -c "$c" -T "$T" -f "$WORK/$w.sql" bench \
               >"$WORK/point.out" 2>"$WORK/point.err" &&
           tps=$(awk '/^tps = / {printf "%.0f", $3}' "$WORK/point.out") && [ -n "$tps" ]; then
            TPS[$w.$c]=$tps
        else
            TPS[$w.$c]="err"
            echo "    pgbench failed for $w at c=$c: $(tail -2 "$WORK/point.err" | tr '\n' ' ')" >&2
        fi
        printf 'c=%-3s %-18s %10s tps\n' "$c" "$w" "${TPS[$w.$c]}" >&2
    done
done

# the table
{
    echo "pgbench -n -M prepared -j min(clients, 2) -T $T, tps per client count, one run on one cluster; PostgreSQL $(q -c 'SHOW server_version'), sharded_seq $EXTVERSION (preloaded), $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    printf '| workload |'; for c in $CLIENTS; do printf ' c=%s |' "$c"; done; echo
    printf '|---|'; for c in $CLIENTS; do printf -- '---:|'; done; echo
    for w in $ORDER; do
        printf '| %s |' "${LABEL[$w]}"
        for c in $CLIENTS; do printf ' %s |' "${TPS[$w.$c]}"; done
        echo
    done
    echo
    echo "Statements: $(for w in $ORDER; do printf '%s `%s`; ' "$w" "${W[$w]//$'\n'/ }"; done | sed 's/; $//')."
    echo "n/a: this build cannot set the workload up (see the run's stderr); err: pgbench failed at that point."
} | tee "$RESULTS/scaling.md"

# the data, for gnuplot
{
    echo "# clients $ORDER"
    for c in $CLIENTS; do
        printf '%s' "$c"
        for w in $ORDER; do
            v="${TPS[$w.$c]}"
            case "$v" in n/a|err) v="n/a" ;; esac
            printf ' %s' "$v"
        done
        echo
    done
} >"$RESULTS/scaling.dat"

# the picture
plots=()
i=2
for w in $ORDER; do
    [ -n "${NA[$w]:-}" ] || plots+=("'scaling.dat' using 1:$i with linespoints lw 2 ps 1.3 ${STYLE[$w]} title '${TITLE[$w]}'")
    i=$((i + 1))
done
xtics=$(echo $CLIENTS | tr ' ' ',')
{
    echo "# gnuplot scaling.gp (in bench/results) draws scaling.png from scaling.dat"
    echo "set terminal TERMINAL size 900,600 noenhanced font 'Sans,11'"
    echo "set output 'scaling.png'"
    echo "set title 'sharded_seq scaling: pgbench -M prepared, ${T} s per point, $(nproc) cores, PostgreSQL $(q -c 'SHOW server_version_num' | sed 's/^\(..\).*/\1/'), sharded_seq $EXTVERSION'"
    echo "set datafile missing 'n/a'"
    echo "set logscale x 2"
    echo "set xrange [$MINC / 1.25 : $MAXC * 1.25]"
    echo "set xtics ($xtics)"
    echo "set xlabel 'clients (log2 scale)'"
    echo "set bmargin 9"
    echo "set ylabel 'transactions per second'"
    echo "set format y '%.0s%c'"
    echo "set yrange [0:*]"
    echo "set grid"
    echo "set key outside below center horizontal maxrows 4 Left reverse box spacing 1.2 width 2"
    sep="plot "
    for p in "${plots[@]}"; do printf '%s%s' "$sep" "$p"; sep=$', \\\n     '; done
    echo
} >"$RESULTS/scaling.gp"
if command -v gnuplot >/dev/null 2>&1 && [ ${#plots[@]} -gt 0 ]; then
    term=png
    gnuplot -e 'set terminal' 2>&1 | grep -qw pngcairo && term=pngcairo
    sed -i "s/TERMINAL/$term/" "$RESULTS/scaling.gp"
    (cd "$RESULTS" && gnuplot scaling.gp) && echo "==> wrote bench/results/scaling.png" >&2 ||
        echo "warning: gnuplot failed; no picture" >&2
else
    sed -i "s/TERMINAL/pngcairo/" "$RESULTS/scaling.gp"
    echo "warning: no picture (no gnuplot, or no workload ran)" >&2
fi
echo "==> wrote bench/results/scaling.md, scaling.dat, scaling.gp" >&2

#!/usr/bin/env bash
# bench/against.sh REV [ROUNDS] [SECONDS]: this tree against an earlier
# revision REV (say d2d9ea0, 1.3's last commit), side by side, for the bars
# that say "no worse than an earlier table": P1 (one statement draws
# 2,000,000 values, against native nextval CACHE 1000) and P2 (pgbench -M
# prepared c=16, against SELECT 1), each against its own cluster's anchors.
#
# REV is built and installed into a copy of the server's installation
# (PostgreSQL finds its libraries and extension files relative to its own
# binaries), so the host's installation keeps this tree's build; the script
# checks that each postmaster mapped its own library.  Two throwaway
# preloaded clusters run at once and take turns: P1 best of ROUNDS + 2, P2
# 2 x ROUNDS rounds, every other one in reverse order.  This tree draws from
# a node-cached sequence (the default) and a per-session one; REV from a
# sequence as REV makes it.  Benchmarks are not tests: nothing here asserts
# a timing.
set -euo pipefail
cd "$(dirname "$0")/.."
REV="${1:?usage: bench/against.sh REV [ROUNDS] [SECONDS]}"
ROUNDS="${2:-3}"
T="${3:-5}"
git rev-parse --verify -q "$REV^{commit}" >/dev/null || { echo "no such revision: $REV" >&2; exit 1; }
[ -n "${SKIP_SETUP:-}" ] || scripts/setup.sh >/dev/null
source bench/lib.sh
HERE_BIN="$PGBIN"
MAJOR="$("$HERE_BIN/pg_config" --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/')"

WORK="$(mktemp -d /tmp/ss_against.XXXXXX)"
chmod 755 "$WORK"
A_DATA="" B_DATA=""
cleanup() {
    for d in "$A_DATA" "$B_DATA"; do
        [ -n "$d" ] && as_pg "$(cat "$d/../bin")/pg_ctl" -D "$d" -m immediate -w stop >/dev/null 2>&1 || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

# REV, installed over a copy of this server's installation
mkdir -p "$WORK/src"
git archive "$REV" | tar -x -C "$WORK/src"
make -s -C "$WORK/src" -j2 PG_CONFIG="$HERE_BIN/pg_config" >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log" >&2; exit 1; }
make -s -C "$WORK/src" PG_CONFIG="$HERE_BIN/pg_config" install DESTDIR="$WORK/inst" >>"$WORK/build.log" 2>&1
mkdir -p "$WORK/inst/usr/lib/postgresql" "$WORK/inst/usr/share/postgresql"
cp -an "/usr/lib/postgresql/$MAJOR" "$WORK/inst/usr/lib/postgresql/"
cp -an "/usr/share/postgresql/$MAJOR" "$WORK/inst/usr/share/postgresql/"
REV_BIN="$WORK/inst/usr/lib/postgresql/$MAJOR/bin"

# start NAME BIN: a preloaded cluster of installation BIN; sets NAME_PORT
start() {
    local name="$1" bin="$2"
    PGBIN="$bin" cluster_create "$WORK/$name"
    echo "shared_preload_libraries = 'sharded_seq'" >>"$PGDATA/postgresql.conf"
    echo "$bin" >"$WORK/$name/bin"
    PGBIN="$bin" cluster_start
    printf -v "${name}_PORT" '%s' "$PGPORT"
    printf -v "${name}_DATA" '%s' "$PGDATA"
    # which library the postmaster mapped: this tree's, or REV's copy
    local pid
    pid="$(head -n 1 "$PGDATA/postmaster.pid")"
    grep -o '/[^ ]*sharded_seq\.so' "/proc/$pid/maps" | head -n 1 >"$WORK/$name/library"
    psql -qX -p "$PGPORT" -d postgres >/dev/null <<SQL
CREATE EXTENSION sharded_seq;
CREATE SEQUENCE n_block CACHE 1000;
SQL
}
start A "$HERE_BIN"
start B "$REV_BIN"
A_LIB="$(cat "$WORK/A/library")"
B_LIB="$(cat "$WORK/B/library")"
case "$B_LIB" in "$WORK"/*) ;; *) echo "the REV cluster did not load REV's library ($B_LIB)" >&2; exit 1 ;; esac
case "$A_LIB" in "$WORK"/*) echo "this tree's cluster loaded REV's library" >&2; exit 1 ;; esac
psql -qX -p "$A_PORT" -d postgres >/dev/null <<'SQL'
SELECT sharded_seq.create_sequence('p_node');
SELECT sharded_seq.create_sequence('p_session', cache => 'session');
SQL
psql -qX -p "$B_PORT" -d postgres -c "SELECT sharded_seq.create_sequence('p_rev')" >/dev/null
A_VERSION="$(psql -qXAt -p "$A_PORT" -d postgres -c "SELECT extversion FROM pg_extension WHERE extname = 'sharded_seq'")"
B_VERSION="$(psql -qXAt -p "$B_PORT" -d postgres -c "SELECT extversion FROM pg_extension WHERE extname = 'sharded_seq'")"

ms() { psql -qX -p "$1" -d postgres -c '\timing on' -c "SELECT count($2) FROM generate_series(1, 2000000)" 2>&1 \
       | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p'; }
best() { tr ' ' '\n' | grep -v '^$' | sort -g | head -n 1; }
declare -A P1
for _ in $(seq 1 $((ROUNDS + 2))); do
    P1[a_native]+=" $(ms "$A_PORT" "nextval('n_block')")"
    P1[a_node]+=" $(ms "$A_PORT" "sharded_nextval('p_node')")"
    P1[a_session]+=" $(ms "$A_PORT" "sharded_nextval('p_session')")"
    P1[b_native]+=" $(ms "$B_PORT" "nextval('n_block')")"
    P1[b_rev]+=" $(ms "$B_PORT" "sharded_nextval('p_rev')")"
done
for k in "${!P1[@]}"; do P1[$k]="$(echo "${P1[$k]}" | best)"; done

echo "SELECT 1;" >"$WORK/select1.sql"
echo "SELECT sharded_nextval('p_node');" >"$WORK/a_node.sql"
echo "SELECT sharded_nextval('p_session');" >"$WORK/a_session.sql"
echo "SELECT sharded_nextval('p_rev');" >"$WORK/b_rev.sql"
declare -A L
run() { pgbench -n -M prepared -j 2 -c 16 -T "$T" -p "$1" -f "$WORK/$2.sql" postgres 2>/dev/null \
        | awk '/^tps = / {printf "%.1f", $3}'; }
for r in $(seq 1 $((2 * ROUNDS))); do
    order="a_select1 a_node a_session b_select1 b_rev"
    [ $((r % 2)) = 0 ] && order="b_rev b_select1 a_session a_node a_select1"
    for w in $order; do
        case $w in
            a_select1) tps=$(run "$A_PORT" select1) ;;
            b_select1) tps=$(run "$B_PORT" select1) ;;
            a_*) tps=$(run "$A_PORT" "$w") ;;
            b_*) tps=$(run "$B_PORT" "$w") ;;
        esac
        L[$w]+=" ${tps:-0}"
    done
done
# lratio CANDIDATE ANCHOR: the median of the per-round ratios
lratio() {
    python3 - "${L[$1]}" "${L[$2]}" <<'PY'
import statistics, sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
print(f"{statistics.median(x / y for x, y in zip(a, b) if y):.3f}")
PY
}
r() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }

echo "this tree: sharded_seq $A_VERSION ($(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ', with changes')), library $A_LIB"
echo "REV:       sharded_seq $B_VERSION ($REV), library $B_LIB"
echo "P1 count over 2,000,000 rows, best of $((ROUNDS + 2)), ms (ratio to the same cluster's nextval CACHE 1000):"
echo "  this tree: nextval ${P1[a_native]}, node cache ${P1[a_node]} ($(r "${P1[a_node]}" "${P1[a_native]}")), per session ${P1[a_session]} ($(r "${P1[a_session]}" "${P1[a_native]}"))"
echo "  REV:       nextval ${P1[b_native]}, sharded_nextval ${P1[b_rev]} ($(r "${P1[b_rev]}" "${P1[b_native]}"))"
echo "  time against REV's: node cache $(r "${P1[a_node]}" "${P1[b_rev]}"), per session $(r "${P1[a_session]}" "${P1[b_rev]}")"
echo "P2 pgbench -M prepared c=16, ${T}s x $((2 * ROUNDS)) rounds, / the same cluster's SELECT 1 (median of per-round ratios):"
echo "  this tree: node cache $(lratio a_node a_select1), per session $(lratio a_session a_select1)   REV: $(lratio b_rev b_select1)"
for w in a_select1 a_node a_session b_select1 b_rev; do printf '  %-10s tps:%s\n' "$w" "${L[$w]}"; done

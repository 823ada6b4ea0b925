#!/usr/bin/env bash
# scripts/all_versions.sh [PATTERN] (also: scripts/test.sh --all-versions):
# run the whole suite on PostgreSQL 15 (the host), 17 (trixie chroot) and 18
# (sid chroot), then the tests that cross majors (test/cross_major/*.sh, run
# from the host).  Each part prints its own "N passed, N failed" and its
# seconds; then come the ten slowest tests over all parts, and the last line
# adds all the parts up.  A part that ends without such a line counts as one
# failure.  Needs root (chroots).
#
# The parts run in SSQ_JOBS chains side by side (2 by default; 1 runs them
# one after the other): the host's suite, then the tests across majors (they
# install a build into the host's PostgreSQL, so they wait for its suite),
# in the first chain; the chroots' suites go to whichever chain is free
# (each chroot's first use also installs its packages).
# A part's output is printed whole when it ends, so parts never interleave.
# The chroots' suites copy their tree from a snapshot taken at the start:
# the host's build and suite write into this tree meanwhile, and a copy
# taken while files change fails (tar: file changed as we read it).
set -uo pipefail
cd "$(dirname "$0")/.."
PATTERN="${1:-}"
JOBS="${SSQ_JOBS:-2}"
WORK="$(mktemp -d /tmp/sharded_seq_all.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

# The majors tested in chroots, as "SUITE LABEL" (scripts/chroot.sh knows
# which major each suite holds).  PostgreSQL 19 goes here, in its own line,
# once scripts/chroot.sh knows its suite.
CHROOTS=(
    "trixie PostgreSQL 17 (trixie)"
    "sid PostgreSQL 18 (sid)"
)

# part N LABEL COMMAND...: run one part into $WORK/part.N.log, then print it
# whole (one part at a time) and keep its closing line and seconds in
# $WORK/part.N.result.
part() {
    local n="$1" label="$2" log="$WORK/part.$1.log" start line
    shift 2
    start=$(date +%s)
    if [ "$JOBS" = 1 ]; then
        echo "==================== $label"
        "$@" 2>&1 | tee "$log"
    else
        "$@" >"$log" 2>&1
        { flock 8; echo "==================== $label"; cat "$log"; } 8>"$WORK/print.lock"
    fi
    line="$(tail -n 1 "$log")"
    printf '%s\n%s\n%s\n' "$label" "$line" $(( $(date +%s) - start )) >"$WORK/part.$n.result"
}

SNAP="$WORK/tree"
mkdir -p "$SNAP"
tar --exclude=./.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' --exclude=./results \
    --exclude=./output_iso --exclude=./output-preloaded --exclude=./output_iso-preloaded \
    --exclude=./log --exclude=./tmp_check -cf - . | tar -C "$SNAP" -xf -

# The chroots' suites are a queue that each chain takes the next one from
# when it is free; the host's suite starts chain 0, and the tests across
# majors end it.  A pattern may name a test of one part only; it must match
# something.
next_chroot() {  # the index of the next chroot not yet taken, or nothing
    local i
    exec 7>>"$WORK/queue.lock"
    flock 7
    i=$(cat "$WORK/queue" 2>/dev/null || echo 0)
    echo $((i + 1)) >"$WORK/queue"
    flock -u 7
    [ "$i" -lt "${#CHROOTS[@]}" ] && echo "$i"
}
chain() {
    local k="$1" i c
    [ "$k" != 0 ] || part 1 "PostgreSQL 15 (host)" scripts/test.sh --may-match-nothing "$PATTERN"
    while i="$(next_chroot)" && [ -n "$i" ]; do
        c="${CHROOTS[$i]}"
        part $((i + 2)) "${c#* }" "$SNAP/scripts/chroot.sh" "${c%% *}" scripts/test.sh --may-match-nothing "$PATTERN"
    done
    [ "$k" != 0 ] || part 9 "across majors" scripts/cross_major.sh --may-match-nothing "$PATTERN"
}
# Every part counts as a failure until it ends with its own result: one
# that never ran (an interrupt, a chain that died) is not left out.
expect() {  # expect N LABEL
    printf '%s\n%s\n%s\n' "$2" "0 passed, 1 failed (did not finish)" 0 >"$WORK/part.$1.result"
    : >"$WORK/part.$1.log"
}
expect 1 "PostgreSQL 15 (host)"
for i in "${!CHROOTS[@]}"; do expect $((i + 2)) "${CHROOTS[$i]#* }"; done
expect 9 "across majors"

# An interrupt (INT, TERM) stops every chain's whole process group (each
# chain is started as a job of its own: a chroot part's test run ends its
# test and its count), waits for them, and the run then ends non-zero with
# what finished.
interrupted=0
chains=()
trap 'interrupted=1; for c in "${chains[@]}"; do kill -TERM -- "-$c" 2>/dev/null; done' INT TERM
set -m
for ((k = 0; k < JOBS; k++)); do
    chain $k &
    chains+=($!)
done
set +m
for c in "${chains[@]}"; do
    wait "$c"
    while kill -0 "$c" 2>/dev/null; do wait "$c"; done
done
trap - INT TERM

total_passed=0
total_failed=0
echo "===================="
for r in "$WORK"/part.*.result; do
    [ -f "$r" ] || continue
    { read -r label; read -r line; read -r secs; } <"$r"
    if [[ "$line" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed( \(did not finish\))?$ ]]; then
        total_passed=$((total_passed + BASH_REMATCH[1]))
        total_failed=$((total_failed + BASH_REMATCH[2]))
    else
        total_failed=$((total_failed + 1)); line="0 passed, 1 failed (no closing line)"
    fi
    printf '%-28s %s (%ss)\n' "$label" "$line" "$secs"
done
# the ten slowest tests over all parts ("ok      NAME (Ns)" lines)
echo "slowest:"
for r in "$WORK"/part.*.result; do
    [ -f "$r" ] || continue
    label="$(head -n 1 "$r")"
    sed -nE 's/^(ok|FAILED) +([^ ]+) \(([0-9.]+)s\)$/\3 \2/p' "${r%.result}.log" |
        awk -v part="${label%% (*}" '{ printf "%s %s, %s\n", $1, $2, part }'
done | sort -rn | head -n 10 | awk '{ printf "  %6.1fs  %s %s %s\n", $1, $2, $3, $4 }'
if [ $((total_passed + total_failed)) = 0 ]; then
    echo "no test matches '$PATTERN'"
    total_failed=1
fi
if [ $interrupted = 1 ]; then
    echo "interrupted"
    [ "$total_failed" != 0 ] || total_failed=1
fi
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" = 0 ]

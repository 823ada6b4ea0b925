#!/usr/bin/env bash
# scripts/all_versions.sh [PATTERN] (also: scripts/test.sh --all-versions):
# run the whole suite on PostgreSQL 15 (the host), 17 (trixie chroot) and 18
# (sid chroot), one major at a time, then the tests that cross majors
# (test/cross_major/*.sh, run from the host).  Each part prints its own
# "N passed, N failed"; the last line adds them all up.  A part that ends
# without such a line counts as one failure.  Needs root (chroots).
set -uo pipefail
cd "$(dirname "$0")/.."
PATTERN="${1:-}"
WORK="$(mktemp -d /tmp/sharded_seq_all.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

total_passed=0
total_failed=0
summary=()
part() {  # part LABEL COMMAND...: run one part, add up its closing line
    local label="$1" log="$WORK/part.log" start line p f
    shift
    echo "==================== $label"
    start=$(date +%s)
    "$@" 2>&1 | tee "$log"
    line="$(tail -n 1 "$log")"
    if [[ "$line" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
        p=${BASH_REMATCH[1]}; f=${BASH_REMATCH[2]}
    else
        p=0; f=1; line="0 passed, 1 failed (no closing line)"
    fi
    total_passed=$((total_passed + p))
    total_failed=$((total_failed + f))
    summary+=("$(printf '%-28s %s (%ss)' "$label" "$line" $(( $(date +%s) - start )))")
}

# a pattern may name a test of one part only; it must match something
part "PostgreSQL 15 (host)" scripts/test.sh --may-match-nothing "$PATTERN"
part "PostgreSQL 17 (trixie)" scripts/chroot.sh trixie scripts/test.sh --may-match-nothing "$PATTERN"
part "PostgreSQL 18 (sid)" scripts/chroot.sh sid scripts/test.sh --may-match-nothing "$PATTERN"
part "across majors" scripts/cross_major.sh --may-match-nothing "$PATTERN"

echo "===================="
printf '%s\n' "${summary[@]}"
if [ $((total_passed + total_failed)) = 0 ]; then
    echo "no test matches '$PATTERN'"
    total_failed=1
fi
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" = 0 ]

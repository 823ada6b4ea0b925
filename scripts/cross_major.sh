#!/usr/bin/env bash
# scripts/cross_major.sh [--may-match-nothing] [PATTERN]: the tests that
# cross PostgreSQL majors (test/cross_major/X_to_Y.sh, listed as
# cross_major/X_to_Y), each one result, run from
# the host with the newer majors in chroots (scripts/chroot.sh).  Part of
# scripts/test.sh --all-versions.  Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
NONE_OK=""
if [ "${1:-}" = --may-match-nothing ]; then NONE_OK=$1; shift; fi
PATTERN="${1:-}"
if ! WERROR=1 scripts/setup.sh; then
    echo "build failed"
    echo "0 passed, 1 failed"
    exit 1
fi
WORK="$(mktemp -d /tmp/sharded_seq_xmajor.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
passed=0 failed=0 skipped=0
echo "==> across majors"
for f in test/cross_major/*_to_*.sh; do
    t="$(basename "$f" .sh)"
    [ -z "$PATTERN" ] || [[ "cross_major/$t" == *"$PATTERN"* ]] || continue
    start=$(date +%s)
    timeout 900 bash "$f" >"$WORK/$t.log" 2>&1
    status=$?
    if [ $status = 77 ]; then
        skipped=$((skipped + 1)); echo "skipped cross_major/$t: $(grep '^SKIP' "$WORK/$t.log" | head -n 1)"
    elif [ $status = 0 ]; then
        passed=$((passed + 1)); echo "ok      cross_major/$t ($(( $(date +%s) - start ))s)"
        grep '^RESULT' "$WORK/$t.log" | sed 's/^/        /'
    else
        failed=$((failed + 1)); echo "FAILED  cross_major/$t"
        sed 's/^/    | /' "$WORK/$t.log" | tail -n 60
    fi
done
[ $skipped = 0 ] || echo "($skipped skipped, not counted)"
if [ $((passed + failed + skipped)) = 0 ]; then
    echo "no test matches '$PATTERN'"
    [ -n "$NONE_OK" ] || failed=1
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

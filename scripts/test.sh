#!/usr/bin/env bash
# scripts/test.sh [PATTERN]: install what is missing, build with warnings as
# errors, and run every pg_regress test, pgTAP file and stress test in
# throwaway clusters.  With PATTERN, run only the tests whose name contains it.
# The last line reads "N passed, N failed"; the exit status is non-zero if
# anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PATTERN="${1:-}"

if ! WERROR=1 scripts/setup.sh; then
    echo "build failed"
    echo "0 passed, 1 failed"
    exit 1
fi
source scripts/lib.sh

passed=0
failed=0
record() {  # record STATUS NAME [LOG]
    if [ "$1" = 0 ]; then
        passed=$((passed + 1)); echo "ok      $2"
    else
        failed=$((failed + 1)); echo "FAILED  $2"
        [ -n "${3:-}" ] && [ -f "$3" ] && sed 's/^/    | /' "$3" | tail -n 60
    fi
}
wanted() { [ -z "$PATTERN" ] || [[ "$1" == *"$PATTERN"* ]]; }

WORK="$(mktemp -d /tmp/sharded_seq_test.XXXXXX)"
chmod 755 "$WORK"
trap 'cluster_destroy >/dev/null 2>&1; rm -rf "$WORK"' EXIT

cluster_create "$WORK/pg" && cluster_start || { echo "could not start PostgreSQL"; echo "0 passed, 1 failed"; exit 1; }

# pg_regress: each test in sql/ is one result
regress=()
for f in sql/*.sql; do
    t="$(basename "$f" .sql)"
    wanted "$t" && regress+=("$t")
done
if [ ${#regress[@]} -gt 0 ]; then
    echo "==> pg_regress"
    make -s installcheck PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config \
        REGRESS="${regress[*]}" >"$WORK/regress.log" 2>&1
    for t in "${regress[@]}"; do
        if grep -Eq "^(ok|test) +[0-9]* *-? *$t +\.\.\. ok|^test $t +\.\.\. ok" "$WORK/regress.log"; then
            record 0 "regress/$t"
        else
            [ -f results/$t.out ] && diff -u "expected/$t.out" "results/$t.out" >"$WORK/$t.diff" 2>&1
            [ -f "$WORK/$t.diff" ] || cp "$WORK/regress.log" "$WORK/$t.diff"
            record 1 "regress/$t" "$WORK/$t.diff"
        fi
    done
fi

# pgTAP: each file runs in a fresh database and is one result
echo "==> pgTAP"
for f in test/*.sql; do
    t="$(basename "$f" .sql)"
    wanted "$t" || continue
    db="tap_$t"
    db_create "$db" pgtap
    timeout 300 pg_prove -d "$db" "$f" >"$WORK/tap_$t.log" 2>&1
    record $? "pgtap/$t" "$WORK/tap_$t.log"
done

# stress tests: each starts (and crashes) clusters of its own
echo "==> stress"
for f in test/stress/*.sh; do
    t="$(basename "$f" .sh)"
    wanted "$t" || continue
    start=$(date +%s)
    timeout 900 bash "$f" >"$WORK/stress_$t.log" 2>&1
    status=$?
    record $status "stress/$t ($(( $(date +%s) - start ))s)" "$WORK/stress_$t.log"
    [ $status = 0 ] && grep '^RESULT' "$WORK/stress_$t.log" | sed 's/^/        /'
done

if [ $((passed + failed)) = 0 ]; then
    echo "no test matches '$PATTERN'"
    failed=1
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

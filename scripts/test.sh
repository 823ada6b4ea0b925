#!/usr/bin/env bash
# scripts/test.sh [PATTERN]: install what is missing, build with warnings as
# errors and with wait points (make WAIT_POINTS=1), and run every pg_regress
# test (sql/), isolation spec (specs/), pgTAP file (test/*.sql), TAP test
# (t/*.pl) and version test (test/versions/), and the checks of the tree
# itself (test/structure/), on the host's PostgreSQL 15 (or the major in
# PG_MAJOR).  The pg_regress tests and the isolation specs run twice: in a
# cluster that does not preload the library (regress/NAME, isolation/NAME),
# and again once it is restarted with shared_preload_libraries = sharded_seq,
# as the README recommends (regress-preloaded/NAME, isolation-preloaded/NAME).
# With PATTERN, run only the tests whose name as listed contains it: a test's
# name, or a group such as isolation/.  Each result line ends with the test's
# seconds, and the ten slowest are listed before the count.
#
# scripts/test.sh --all-versions [PATTERN]: the same on PostgreSQL 15 (the
# host), 17 (a trixie chroot) and 18 (a sid chroot), one after the other, then
# the tests that cross majors (test/cross_major/), with one closing line over
# all of them.  Needs root; see scripts/chroot.sh.
#
# The last line reads "N passed, N failed"; the exit status is non-zero if
# anything failed.  A PATTERN that matches no test is a failure, unless
# --may-match-nothing comes first (scripts/all_versions.sh passes it: there,
# a pattern may name a test of one part only).  An interrupt (INT, TERM)
# stops the test under way and ends the run with its count.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --all-versions ]; then
    shift
    exec scripts/all_versions.sh "$@"
fi
NONE_OK=""
if [ "${1:-}" = --may-match-nothing ]; then NONE_OK=$1; shift; fi
PATTERN="${1:-}"
export PG_MAJOR="${PG_MAJOR:-15}"
PGBIN="/usr/lib/postgresql/$PG_MAJOR/bin"
export PATH="$PGBIN:$PATH"

# wait_for PID: wait for a background job, also when a trapped signal
# interrupts the wait (bash runs a trap only once the foreground command
# ends, so long commands run in the background); returns the job's status.
wait_for() {
    local st=0
    wait "$1" || st=$?
    while kill -0 "$1" 2>/dev/null; do st=0; wait "$1" || st=$?; done
    return $st
}

# The runner's own server, for pg_regress, the isolation specs and pgTAP, is
# a throwaway pg_virtualenv cluster (-t: in a temporary directory, on a free
# port; it sets PGHOST, PGPORT, PGUSER and PGPASSWORD), in which this script
# runs itself again.  pg_virtualenv's own messages go to a log, so that the
# last line is still this script's count: fd 3 carries the runner's output.
# An interrupt (INT, TERM) goes to the runner inside, which stops its test and
# ends with its count; pg_virtualenv then removes the cluster.
if [ -z "${SSQ_TEST_CLUSTER:-}" ]; then
    # t/citus.pl needs Citus, built from ../shared/citus once and cached
    # (PostgreSQL 15 only; without the sources it says so and the test skips)
    if ! WERROR=1 WAIT_POINTS=1 MEMCACHED=1 scripts/setup.sh || ! scripts/citus.sh; then
        echo "build failed"
        echo "0 passed, 1 failed"
        exit 1
    fi
    log="$(mktemp /tmp/sharded_seq_virtualenv.XXXXXX)"
    interrupted=0
    # two runs starting at once may pick the same port: then try again
    for attempt in 1 2 3; do
        env -u PGHOST -u PGPORT -u PGUSER -u PGDATABASE SSQ_TEST_CLUSTER=1 \
            pg_virtualenv -t -v "$PG_MAJOR" -c "--locale=C.UTF-8 --encoding=UTF8" \
            -o max_prepared_transactions=10 bash "$0" $NONE_OK "$@" 3>&1 >"$log" 2>&1 &
        venv=$!
        trap 'interrupted=1; pkill -TERM -P $venv 2>/dev/null' INT TERM
        status=0
        wait_for $venv || status=$?
        trap - INT TERM
        if grep -q "^SSQ_TEST_CLUSTER started" "$log"; then break; fi
        echo "could not start PostgreSQL (attempt $attempt):"; tail -n 20 "$log"
        if [ $interrupted = 1 ] || [ $attempt = 3 ]; then echo "0 passed, 1 failed"; break; fi
    done
    rm -f "$log"
    exit $status
fi
echo "SSQ_TEST_CLUSTER started"
exec >&3 2>&3 3>&-
# what pg_virtualenv sets, which a test with servers of its own must not see
OWN_CLUSTER=(-u PGHOST -u PGPORT -u PGUSER -u PGDATABASE -u PGPASSWORD -u PGSYSCONFDIR -u PG_CLUSTER_CONF_ROOT)

# Run a command as the user that owns the clusters (from /, which it can
# enter: root's working directory, such as /root, may be closed to it).
as_pg() {
    if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

passed=0
failed=0
skipped=0

# An interrupt stops the test under way (its whole process tree: a TAP test's
# END blocks then stop its servers) and ends the run with its count.
interrupted=0
running=""
kill_tree() {
    local c
    for c in $(pgrep -P "$1"); do kill_tree "$c"; done
    kill -TERM "$1" 2>/dev/null
}
trap 'interrupted=1; [ -z "$running" ] || kill_tree "$running"' INT TERM
# run_test COMMAND...: run it in the background and wait for it (so that an
# interrupt is handled at once); after an interrupt, end the run (on fd 4,
# the runner's output: a caller may have sent this call's output to a log).
exec 4>&1
run_test() {
    local st=0
    "$@" &
    running=$!
    wait_for "$running" || st=$?
    running=""
    if [ $interrupted = 1 ]; then
        failed=$((failed + 1))
        echo "interrupted (logs of this run: $WORK)" >&4
        echo "$passed passed, $failed failed" >&4
        exit 130
    fi
    return $st
}
# record STATUS NAME MS [LOG [head]]: one result, with the test's time (its
# milliseconds go to $WORK/times, for the ten slowest at the end); on a
# failure, the log's last 60 lines, or its first 120
record() {
    local secs
    secs="$(awk -v ms="$3" 'BEGIN { printf (ms < 10000 ? "%.1f" : "%.0f"), ms / 1000 }')"
    echo "$3 $2" >>"$WORK/times"
    if [ "$1" = 0 ]; then
        passed=$((passed + 1)); echo "ok      $2 (${secs}s)"
    else
        failed=$((failed + 1)); echo "FAILED  $2 (${secs}s)"
        if [ -n "${4:-}" ] && [ -f "$4" ]; then
            if [ "${5:-}" = head ]; then sed 's/^/    | /' "$4" | head -n 120
            else sed 's/^/    | /' "$4" | tail -n 60; fi
        fi
    fi
}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
wanted() { [ -z "$PATTERN" ] || [[ "$1" == *"$PATTERN"* ]]; }

WORK="$(mktemp -d /tmp/sharded_seq_test.XXXXXX)"
chmod 755 "$WORK"
# a failed run keeps its logs (and says where, before its count)
trap '[ "$failed" != 0 ] || rm -rf "$WORK"' EXIT

# regress_results GROUP LOG RESULTS NAME...: one result per NAME from the
# LOG of pg_regress or pg_isolation_regress ("test NAME ... ok  N ms" up to
# 15, "ok N - NAME  N ms" from 16), with pg_regress's time of it; a failure
# shows its diff against expected/NAME.out (RESULTS/NAME.out), or the log if
# there is none.  (pg_regress also accepts expected/NAME_1.out: a test whose
# output differs when the library is preloaded has one, and says why.)
# own_expected GROUP RESULTS NAME: where a test has an alternative output
# (expected/NAME_1.out: preloaded), pg_regress takes either for either run;
# each configuration must match its own, so that a preloaded run behaving as
# if not preloaded (or the reverse) fails.  Whitespace as pg_regress (-w).
own_expected() {
    local e="expected/$3.out"
    [ -f "expected/${3}_1.out" ] || return 0
    [[ "$1" == *-preloaded ]] && e="expected/${3}_1.out"
    if ! diff -w -q "$e" "$2/$3.out" >/dev/null 2>&1; then
        { echo "$3: pg_regress took it, but the output is not $e, this configuration's own:"
          diff -u "$e" "$2/$3.out"; } >"$WORK/$1_$3.own" 2>&1
        return 1
    fi
}

regress_results() {
    local group="$1" log="$2" results="$3" t line ms e
    shift 3
    for t in "$@"; do
        line="$(grep -E "^(ok|not ok|test) +([0-9]+ +[-+] +)?$t +(\.\.\. )?|^ +$t +\.\.\. " "$log" | head -n 1)"
        ms="$(sed -nE 's/.* ([0-9]+) ms$/\1/p' <<<"$line")"
        if grep -Eq "^(ok|test) +[0-9]* *-? *$t +\.\.\. ok|^test $t +\.\.\. ok|^ok +[0-9]+ +[-+] +$t +[0-9]" "$log" &&
            own_expected "$group" "$results" "$t"; then
            record 0 "$group/$t" "${ms:-0}"
        else
            # against the expected output it differs from least
            if [ -f "$results/$t.out" ]; then
                for e in expected/$t.out expected/${t}_[1-9].out; do
                    [ -f "$e" ] || continue
                    diff -u "$e" "$results/$t.out" >"$WORK/${group}_$t.d" 2>&1
                    if [ ! -f "$WORK/${group}_$t.diff" ] ||
                        [ "$(wc -l <"$WORK/${group}_$t.d")" -lt "$(wc -l <"$WORK/${group}_$t.diff")" ]; then
                        mv "$WORK/${group}_$t.d" "$WORK/${group}_$t.diff"
                    fi
                done
                rm -f "$WORK/${group}_$t.d"
            fi
            [ ! -f "$WORK/${group}_$t.own" ] || mv "$WORK/${group}_$t.own" "$WORK/${group}_$t.diff"
            [ -f "$WORK/${group}_$t.diff" ] || cp "$log" "$WORK/${group}_$t.diff"
            record 1 "$group/$t" "${ms:-0}" "$WORK/${group}_$t.diff" head
        fi
    done
}

# run_regress SUFFIX: the pg_regress tests (sql/, one result per file) and
# the isolation specs (specs/, one result per spec) in the runner's cluster,
# listed as regress$SUFFIX/NAME and isolation$SUFFIX/NAME.  Their outputs go
# to results/ and output_iso/results/, or with a SUFFIX to
# output$SUFFIX/results/ and output_iso$SUFFIX/results/.
run_regress() {
    local sfx="$1" f t regress=() iso=() out out_iso
    out="${sfx:+output$sfx/}results"
    out_iso="output_iso$sfx"
    for f in sql/*.sql; do
        t="$(basename "$f" .sql)"
        wanted "regress$sfx/$t" && regress+=("$t")
    done
    if [ ${#regress[@]} -gt 0 ]; then
        echo "==> pg_regress$sfx"
        rm -rf "$out"
        run_test make -s installcheck PG_CONFIG="$PGBIN/pg_config" EXTRA_REGRESS_OPTS="${sfx:+--outputdir=output$sfx}" \
            WAIT_POINTS=1 MEMCACHED=1 ISOLATION= TAP_TESTS= REGRESS="${regress[*]}" >"$WORK/regress$sfx.log" 2>&1
        regress_results "regress$sfx" "$WORK/regress$sfx.log" "$out" "${regress[@]}"
    fi
    for f in specs/*.spec; do
        [ -e "$f" ] || continue
        t="$(basename "$f" .spec)"
        wanted "isolation$sfx/$t" && iso+=("$t")
    done
    if [ ${#iso[@]} -gt 0 ]; then
        echo "==> isolation$sfx"
        rm -rf "$out_iso"
        run_test make -s installcheck PG_CONFIG="$PGBIN/pg_config" EXTRA_REGRESS_OPTS="--outputdir=$out_iso" \
            WAIT_POINTS=1 MEMCACHED=1 REGRESS= TAP_TESTS= ISOLATION="${iso[*]}" >"$WORK/isolation$sfx.log" 2>&1
        regress_results "isolation$sfx" "$WORK/isolation$sfx.log" "$out_iso/results" "${iso[@]}"
    fi
}
run_regress ""

# pgTAP: each file runs in a fresh database and is one result
echo "==> pgTAP"
for f in test/*.sql; do
    t="$(basename "$f" .sql)"
    wanted "pgtap/$t" || continue
    db="tap_$t"
    psql -qX -v ON_ERROR_STOP=1 -d postgres -c "CREATE DATABASE \"$db\"" >/dev/null
    psql -qX -v ON_ERROR_STOP=1 -d "$db" -c "CREATE EXTENSION sharded_seq" -c "CREATE EXTENSION pgtap" >/dev/null
    start=$(now_ms)
    status=0
    run_test timeout 300 pg_prove -d "$db" "$f" >"$WORK/tap_$t.log" 2>&1 || status=$?
    record $status "pgtap/$t" $(( $(now_ms) - start )) "$WORK/tap_$t.log"
done

# The same pg_regress tests and specs with the library preloaded, as the
# README recommends: the runner's cluster restarted with
# shared_preload_libraries = sharded_seq (the node cache, the worker,
# 'buffered' counters and kept totals are then there).
# The databases of the first run go first: a preloaded server's worker
# would be connected to them when pg_regress drops them.
if grep -q . <(for f in sql/*.sql; do wanted "regress-preloaded/$(basename "$f" .sql)" && echo y; done
               for f in specs/*.spec; do wanted "isolation-preloaded/$(basename "$f" .spec)" && echo y; done); then
    psql -qX -v ON_ERROR_STOP=1 -d postgres -c "DROP DATABASE IF EXISTS contrib_regression" \
        -c "DROP DATABASE IF EXISTS isolation_regression" \
        -c "ALTER SYSTEM SET shared_preload_libraries = 'sharded_seq'" >"$WORK/restart.log" 2>&1 &&
        pg_ctlcluster "$PG_MAJOR" regress restart >>"$WORK/restart.log" 2>&1 &&
        psql -qX -d postgres -At -c "SHOW shared_preload_libraries" | grep -qx sharded_seq || {
            failed=$((failed + 1)); echo "FAILED  restarting the runner's cluster preloaded"; sed 's/^/    | /' "$WORK/restart.log"; }
    run_regress -preloaded
fi

# TAP tests: each t/*.pl is one result.  They start their own clusters
# (PostgreSQL::Test::Cluster), which initdb refuses to do as root: as root,
# they run as the postgres user from a copy of t/ it can read.
taps=()
for f in t/*.pl; do
    [ -e "$f" ] || continue
    t="$(basename "$f" .pl)"
    wanted "tap/$t" && taps+=("$t")
done
if [ ${#taps[@]} -gt 0 ]; then
    echo "==> tap"
    pgxs="$("/usr/lib/postgresql/$PG_MAJOR/bin/pg_config" --pkglibdir)/pgxs"
    cp -r t "$WORK/t"
    # t/monitoring.pl runs the postgres_exporter queries users are given
    mkdir -p "$WORK/docs" && cp -r docs/monitoring "$WORK/docs/"
    # every TAP test's nodes are copies of one cluster initdb makes once in
    # this run (t/ShardedSeq/Node.pm)
    mkdir -p "$WORK/initdb"
    # ports reserved in one place for every run at once, chroots included
    # (they share the host's /dev/shm and network): scripts/all_versions.sh
    # runs majors side by side
    mkdir -p -m 1777 /dev/shm/sharded_seq_ports 2>/dev/null
    [ "$(id -u)" = 0 ] && chown -R postgres: "$WORK/t" "$WORK/docs" "$WORK/initdb"
    for t in "${taps[@]}"; do
        start=$(now_ms)
        mkdir -p "$WORK/tap/$t"
        [ "$(id -u)" = 0 ] && chown postgres: "$WORK/tap/$t"
        status=0
        run_test as_pg timeout 900 env "${OWN_CLUSTER[@]}" \
            SSQ_INITDB_TEMPLATE="$WORK/initdb" PG_TEST_PORT_DIR=/dev/shm/sharded_seq_ports TESTDIR="$WORK/tap/$t" TESTDATADIR="$WORK/tap/$t/tmp_check" TESTLOGDIR="$WORK/tap/$t/tmp_check/log" PATH="$PGBIN:$PATH" PG_REGRESS="$pgxs/src/test/regress/pg_regress" \
            prove -v -I "$pgxs/src/test/perl" -I "$WORK/t" "$WORK/t/$t.pl" >"$WORK/tap_$t.log" 2>&1 || status=$?
        # a server the test left running (pg_ctl detaches servers, so a test
        # killed before its END blocks ran leaves them behind): stopped here
        leftover=""
        for pidfile in $(find "$WORK/tap/$t" -name postmaster.pid 2>/dev/null); do
            as_pg "$PGBIN/pg_ctl" -D "$(dirname "$pidfile")" status >/dev/null 2>&1 || continue
            as_pg "$PGBIN/pg_ctl" -D "$(dirname "$pidfile")" -m immediate -w stop >/dev/null 2>&1
            leftover+=" $(dirname "$pidfile")"
        done
        [ -z "$leftover" ] || [ $status != 0 ] || status=1
        # a TAP test with nothing to check here (plan skip_all) says why
        if [ $status = 0 ] && grep -q "^$WORK/t/$t.pl \.\. skipped: " "$WORK/tap_$t.log"; then
            skipped=$((skipped + 1))
            echo "skipped tap/$t: $(sed -n "s|^$WORK/t/$t.pl \.\. skipped: ||p" "$WORK/tap_$t.log" | head -n 1)"
            continue
        fi
        if [ $status != 0 ]; then
            # what failed first, then the end of prove's output, then the
            # end of each server's log (the whole logs stay in $WORK/tap,
            # which a failed run keeps)
            {
                [ $status != 124 ] || echo "--- timed out after 900 s"
                [ -z "$leftover" ] || echo "--- servers it left running, stopped:$leftover"
                echo "--- failed assertions"
                grep -E '^not ok|Failed test|^# +got:|^# +expected:|timed out|Bail out|died|No plan' "$WORK/tap_$t.log" | head -n 20
                echo "--- the end of the test's output"
                tail -n 25 "$WORK/tap_$t.log"
                # prove shows nothing of a test it was killed with: its own log
                if [ "$(wc -l <"$WORK/tap_$t.log")" -lt 3 ]; then
                    tail -n 25 "$WORK/tap/$t/tmp_check/log/regress_log_$t" 2>/dev/null
                fi
                for l in "$WORK/tap/$t"/tmp_check/log/*.log; do
                    [ -f "$l" ] && { echo "--- $l"; tail -n 12 "$l"; }
                done
            } >"$WORK/tap_$t.fail"
        fi
        record $status "tap/$t" $(( $(now_ms) - start )) "$WORK/tap_$t.fail" head
        # each assertion's name, and each RESULT a test notes (its numbers)
        [ $status = 0 ] && grep -E '^(ok [0-9]+ - |# RESULT )' "$WORK/tap_$t.log" | sed 's/^# //; s/^/        /'
    done
fi

# structure and version tests: checks of the tree itself (test/structure/),
# and of the install scripts and the package (test/versions/).  A test that
# exits 77 has nothing to check here (it says why): it is listed as skipped,
# and counts neither as passed nor as failed.
for group in structure versions; do
    echo "==> $group"
    for f in test/$group/*.sh; do
        [ -e "$f" ] || continue
        t="$(basename "$f" .sh)"
        wanted "$group/$t" || continue
        start=$(now_ms)
        # without this runner's cluster (versions/package starts its own)
        status=0
        run_test timeout 900 env "${OWN_CLUSTER[@]}" \
            bash "$f" >"$WORK/${group}_$t.log" 2>&1 || status=$?
        if [ $status = 77 ]; then
            skipped=$((skipped + 1))
            echo "skipped $group/$t: $(grep '^SKIP' "$WORK/${group}_$t.log" | head -n 1)"
            continue
        fi
        record $status "$group/$t" $(( $(now_ms) - start )) "$WORK/${group}_$t.log"
        [ $status = 0 ] && grep '^RESULT' "$WORK/${group}_$t.log" | sed 's/^/        /'
    done
done

[ $skipped = 0 ] || echo "($skipped skipped, not counted)"
if [ -s "$WORK/times" ]; then
    echo "slowest:"
    sort -rn "$WORK/times" | head -n 10 | awk '{ printf "  %6.1fs  %s\n", $1 / 1000, $2 }'
fi
if [ $((passed + failed + skipped)) = 0 ]; then
    echo "no test matches '$PATTERN'"
    [ -n "$NONE_OK" ] || failed=1
fi
[ "$failed" = 0 ] || echo "(logs of this run: $WORK)"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

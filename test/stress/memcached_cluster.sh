#!/usr/bin/env bash
# A memcached cluster: three real memcached servers on loopback in one
# sharded_seq.memcached_servers list.  Memcached-tier sequences and
# write-behind counters are created until every server holds the key of at
# least one counter and of at least one sequence.  6 sessions draw values and
# increment counters (some transactions rolled back; each committed delta goes
# to a ledger in the same transaction) while one server is killed with
# SIGKILL and restarted empty on the same port.  Then:
#   - no session saw an error;
#   - no sequence value was handed out twice, and each session's values of
#     each sequence increase;
#   - after flush_counters(), no counter total exceeds its committed sum;
#   - a counter whose memcached key lives on a surviving server is exact: the
#     lost server costs nothing but its own keys;
#   - a counter whose key lived on the lost server lost at most what was
#     committed to it around the kill (from two flush intervals before it to
#     half a second after it): the unflushed amount on that server;
#   - the counters' keys stayed on their servers (none moved to another);
#   - the restarted server serves keys again.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/../../scripts/lib.sh"

# The counter mode that writes behind through memcached ('buffered' up to
# 1.2; 'buffered' is shared memory since 1.3).
# This is the only place the test names it.
MODE=memcached

SESSIONS=6
TRANSACTIONS=16000         # per session: enough load to outlast the kill and restart
SEQS=6                     # memcached-tier sequences to start with
COUNTERS=12                # write-behind counters to start with
BEFORE_KILL=3              # seconds of load before the kill
DOWN=1                     # seconds the server stays down
AFTER_RESTART=3            # seconds of load after the restart, at least
# A counter on the killed server may lose what that server held unflushed:
# with a flush interval of 1 s, what was committed since the flush of the
# interval before (2 s before the kill, at most), plus increments under way at
# the kill.  Increments made while it is down go to the rows, and later ones
# to the restarted server.  So the loss must stay within what was committed
# from LOSS_BEFORE seconds before the kill to LOSS_AFTER seconds after it.
LOSS_BEFORE=2
LOSS_AFTER=0.5

WORK="$(mktemp -d /tmp/ss_mcc.XXXXXX)"
chmod 755 "$WORK"
MC_PORTS=()
MC_PIDS=()
mc_start() {  # mc_start INDEX: start server INDEX (empty) on its port
    memcached_start "${MC_PORTS[$1]}"
    MC_PIDS[$1]=$MEMCACHED_PID
}
mc_kill() {  # mc_kill INDEX SIGNAL
    MEMCACHED_PID="${MC_PIDS[$1]:-}"
    memcached_kill "$2"
    MC_PIDS[$1]=""
}
cleanup() {
    for i in "${!MC_PIDS[@]}"; do mc_kill "$i" KILL; done
    cluster_destroy >/dev/null 2>&1
    [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT

for i in 0 1 2; do
    while :; do
        p="$(free_port)"
        [[ " ${MC_PORTS[*]} " == *" $p "* ]] || break
    done
    MC_PORTS[$i]=$p
    mc_start "$i"
done
SERVERS="127.0.0.1:${MC_PORTS[0]},127.0.0.1:${MC_PORTS[1]},127.0.0.1:${MC_PORTS[2]}"
echo "memcached servers: $SERVERS"

cluster_create "$WORK/pg"
cat >>"$PGDATA/postgresql.conf" <<CONF
shared_preload_libraries = 'sharded_seq'
sharded_seq.memcached_servers = '$SERVERS'
sharded_seq.counter_flush_interval = 1
CONF
cluster_start
db_create stress
q() { psql -qXAt -d stress -c "$1"; }
psql -qX -v ON_ERROR_STOP=1 -d stress <<'SQL' >/dev/null
CREATE TABLE ledger (counter text, delta bigint, at timestamptz DEFAULT clock_timestamp());
SQL

add_objects() {  # add_objects FIRST_SEQ LAST_SEQ FIRST_COUNTER LAST_COUNTER
    local i
    for i in $(seq "$1" "$2"); do
        # small leases (batches of 5): new leases, whose keys land on every
        # server, all through the load
        q "SELECT sharded_seq.create_sequence('ms$i', tier => 'memcached', block => 500)" >/dev/null
        # one draw publishes the lease
        q "SELECT 'ms$i', sharded_nextval('ms$i')" >>"$WORK/warm.out"
    done
    for i in $(seq "$3" "$4"); do
        q "SELECT sharded_seq.create_counter('mc$i', shards => 2, mode => '$MODE')" >/dev/null
        # one committed increment creates the key in memcached
        psql -qX -v ON_ERROR_STOP=1 -d stress -c "BEGIN" \
            -c "SELECT counter_incr('mc$i', 1)" -c "INSERT INTO ledger VALUES ('mc$i', 1)" -c "COMMIT" >/dev/null
    done
}

# where: for each counter's pending amount, each sequence's lease pointer
# and the lease counter it points to, the index of the one server that holds
# its key ("none" or "many" otherwise), as "counter|sequence|lease NAME INDEX"
# lines.  Keys are the extension's own:
# ss:<system id>:<database oid>:<installation token, hex>:<suffix>.
where() {
    q "WITH k AS (SELECT 'ss:' || (SELECT system_identifier FROM pg_control_system()) || ':' ||
                         (SELECT oid FROM pg_database WHERE datname = current_database()) || ':' ||
                         (SELECT to_hex(token) FROM sharded_seq.installation) AS p,
                         (SELECT timeline_id FROM pg_control_checkpoint()) AS tli)
       SELECT 'counter ' || name || ' ' || p || ':ctr:' || id || ':pending'
         FROM sharded_seq.counter_config, k
       UNION ALL
       SELECT 'sequence ' || name || ' ' || p || ':seq:' || id || ':g' || generation || ':t' || tli || ':cur'
         FROM sharded_seq.sequence_config, k
       ORDER BY 1" |
    python3 -c '
import socket, sys
ports = [int(p) for p in sys.argv[1:]]
def get(port, key):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        return None
    s.sendall(b"get " + key.encode() + b"\r\n")
    buf = b""
    while not (buf.endswith(b"END\r\n") or buf.startswith(b"ERROR") or buf.startswith(b"CLIENT_ERROR")):
        chunk = s.recv(4096)
        if not chunk:
            break
        buf += chunk
    s.close()
    if not buf.startswith(b"VALUE "):
        return None
    return buf.split(b"\r\n")[1].decode().strip()
def find(key):
    at = [(i, v) for i, p in enumerate(ports) for v in [get(p, key)] if v is not None]
    return (at[0] if len(at) == 1 else ("none" if not at else "many", None))
for line in sys.stdin:
    kind, name, key = line.split()
    i, v = find(key)
    print(kind, name, i)
    if kind == "sequence" and v is not None:
        # the lease counter: the pointer names the lease by its first value
        print("lease", name, find(key[:-len("cur")] + "L" + v)[0])
' "${MC_PORTS[@]}"
}

# Objects until every server holds a counter key and a sequence key (modula
# or ketama, three servers and a dozen keys nearly always do at once).
add_objects 1 "$SEQS" 1 "$COUNTERS"
for round in $(seq 1 30); do
    where >"$WORK/where"
    if grep -q ' none$\| many$' "$WORK/where"; then
        echo "a key is on no server, or on several:"; grep ' none$\| many$' "$WORK/where"; exit 1
    fi
    spread_ok=1
    for i in 0 1 2; do
        grep -q "^counter .* $i\$" "$WORK/where" && grep -q "^sequence .* $i\$" "$WORK/where" || spread_ok=0
    done
    [ $spread_ok = 1 ] && break
    SEQS=$((SEQS + 1)); COUNTERS=$((COUNTERS + 1))
    add_objects "$SEQS" "$SEQS" "$COUNTERS" "$COUNTERS"
done
[ $spread_ok = 1 ] || { echo "keys did not spread over the three servers:"; cat "$WORK/where"; exit 1; }
for i in 0 1 2; do
    echo "RESULT server $i (port ${MC_PORTS[$i]}): counters $(awk -v s=$i '$1 == "counter" && $3 == s {printf "%s ", $2}' "$WORK/where")| lease pointers $(awk -v s=$i '$1 == "sequence" && $3 == s {printf "%s ", $2}' "$WORK/where")"
done

# Each session's values go to NAME.i.out as "sequence|value" lines.
script() {  # script TRANSACTIONS SEQS COUNTERS PHASE SESSION
    python3 - "$@" <<'PY'
import random, sys
n, nseq, nctr, phase, session = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
rnd = random.Random(f"{phase}/{session}")
out = []
for i in range(n):
    end = "ROLLBACK" if rnd.random() < 0.3 else "COMMIT"
    if rnd.random() < 0.45:
        s = f"ms{rnd.randint(1, nseq)}"
        out.append(f"BEGIN; SELECT '{s}', sharded_nextval('{s}') FROM generate_series(1, {rnd.choice([1, 1, 3])}); {end};")
    else:
        # now and then two counters in one transaction, likely on two servers
        parts = []
        for c in rnd.sample(range(1, nctr + 1), 2 if rnd.random() < 0.2 else 1):
            d = rnd.randint(1, 9)
            parts.append(f"SELECT counter_incr('mc{c}', {d}) \\g /dev/null\nINSERT INTO ledger VALUES ('mc{c}', {d});")
        out.append("BEGIN; " + "\n".join(parts) + f" {end};")
print("\n".join(out))
PY
}
misses() {  # misses KIND: how often KIND fell back to the database or got a memcached error
    q "SELECT coalesce(sum(fallbacks + errors), 0) FROM sharded_seq.memcached_stats WHERE kind = '$1'"
}

echo "load: $SESSIONS sessions, $SEQS sequences, $COUNTERS counters (mode $MODE); one server is killed and restarted"
seq_before=$(misses sequence)
ctr_before=$(misses counter)
start=$(date +%s.%N)
run_sessions stress load "$SESSIONS" script "$TRANSACTIONS" "$SEQS" "$COUNTERS"
sleep "$BEFORE_KILL"
sessions_running || { echo "the load ended before the kill: test is void"; exit 1; }
# the victim: the server that holds the most leases in use (every server
# holds counters' keys)
where >"$WORK/where.kill"
VICTIM=$(awk '$1 == "lease" && $3 ~ /^[0-9]$/ {n[$3]++} END {best = 0; for (i = 1; i <= 2; i++) if (n[i] > n[best]) best = i; print best}' "$WORK/where.kill")
VICTIM_COUNTERS="$(awk -v s=$VICTIM '$1 == "counter" && $3 == s {print $2}' "$WORK/where")"
t_kill=$(date +%s.%N)
mc_kill "$VICTIM" KILL
echo "  leases in use on server $VICTIM: $(awk -v s=$VICTIM '$1 == "lease" && $3 == s {printf "%s ", $2}' "$WORK/where.kill")"
echo "  server $VICTIM killed (SIGKILL) at +$(python3 -c "print(round($t_kill - $start, 1))")s"
sleep "$DOWN"
psql -qXAt -d stress -c "SELECT '  ' || server || ':' || port || ' healthy=' || healthy FROM sharded_seq.memcached_servers()"
mc_start "$VICTIM"
echo "  server $VICTIM restarted, empty, on port ${MC_PORTS[$VICTIM]}"
sleep "$AFTER_RESTART"
sessions_running || { echo "the load ended too soon after the restart: test is void"; exit 1; }
wait_sessions
echo "  load done after $(python3 -c "print(round($(date +%s.%N) - $start, 1))")s"

if cat "$WORK"/load.*.err | grep -q .; then
    echo "a session saw an error:"; cat "$WORK"/load.*.err | sort | uniq -c | head; exit 1
fi
echo "RESULT no session saw an error"
seq_after=$(misses sequence)
ctr_after=$(misses counter)
echo "RESULT fallbacks and memcached errors: sequences $seq_before before the kill, $seq_after after; counters $ctr_before before, $ctr_after after"
[ "$seq_after" -gt "$seq_before" ] || { echo "no sequence noticed the kill: test is void"; exit 1; }
[ "$ctr_after" -gt "$ctr_before" ] || { echo "no counter noticed the kill: test is void"; exit 1; }

# values: one file per session and sequence, in the order the session got them
mkdir "$WORK/values"
for f in "$WORK"/load.*.out "$WORK/warm.out"; do
    awk -F'|' -v dir="$WORK/values" -v s="$(basename "$f" .out)" \
        'NF == 2 && $2 ~ /^[0-9]+$/ { print $2 > (dir "/" $1 "." s) }' "$f"
done
total_values=0
for i in $(seq 1 "$SEQS"); do
    out=$(python3 "$HERE/check_values.py" "$WORK/values/ms$i".*) || { echo "ms$i: $out"; exit 1; }
    echo "  ms$i: ${out#RESULT }"
    total_values=$((total_values + $(sed -n 's/.*values=\([0-9]*\).*/\1/p' <<<"$out")))
done
echo "RESULT $total_values values of $SEQS sequences: none twice, each session's in increasing order"

# counters: everything flushed, then each total against its ledger
q "SELECT sharded_seq.flush_counters()" >/dev/null
python3 - "$t_kill" "$LOSS_BEFORE" "$LOSS_AFTER" "$VICTIM_COUNTERS" <<'PY' >"$WORK/counters.sql"
import sys
t_kill, before, after, victims = sys.argv[1:5]
names = ",".join(f"'{v}'" for v in victims.split()) or "NULL"
print(f"""
SELECT c.name, c.total, coalesce(c.pending::text, 'NULL'), l.sum, l.window_sum, l.second_sum, c.name IN ({names}) AS lost_server
  FROM sharded_seq.counters c
  JOIN (SELECT counter, sum(delta) AS sum,
               coalesce(sum(delta) FILTER (WHERE at >= to_timestamp({t_kill}) - interval '{before} s'
                                              AND at <= to_timestamp({t_kill}) + interval '{after} s'), 0) AS window_sum,
               coalesce(sum(delta) FILTER (WHERE at >= to_timestamp({t_kill}) - interval '1 s'
                                              AND at <= to_timestamp({t_kill})), 0) AS second_sum
          FROM ledger GROUP BY counter) l ON l.counter = c.name
 ORDER BY c.name;""")
PY
psql -qXAt -F ' ' -d stress -f "$WORK/counters.sql" >"$WORK/counters"
bad=0
surv_bad=0
while read -r name total pending sum window second lost; do
    loss=$((sum - total))
    fails=()
    [ "$total" -le "$sum" ] || fails+=("total $total exceeds the committed sum $sum")
    [ "$pending" = 0 ] || fails+=("pending $pending after flush_counters()")
    if [ "$lost" = f ]; then
        [ "$total" = "$sum" ] || {
            fails+=("its key lives on a surviving server, yet its total $total is not the committed $sum")
            surv_bad=1; }
    else
        [ "$loss" -le "$window" ] || fails+=("lost $loss, more than the $window committed around the kill")
    fi
    for f in "${fails[@]}"; do echo "$name: $f"; bad=1; done
    if [ "$lost" = t ]; then
        echo "  $name (lost server): total $total, committed $sum, lost $loss (bound $window; $second committed in the second before the kill)"
    fi
done <"$WORK/counters"
read -r n_surv surv_sum <<<"$(awk '$7 == "f" {n++; s += $4} END {print n + 0, s + 0}' "$WORK/counters")"
read -r n_lost lost_sum lost_total <<<"$(awk '$7 == "t" {n++; s += $4; t += $2} END {print n + 0, s + 0, t + 0}' "$WORK/counters")"
echo "RESULT counters on surviving servers: $n_surv, committed $surv_sum, all exact: $([ $surv_bad = 0 ] && echo yes || echo no)"
echo "RESULT counters on the lost server: $n_lost, committed $lost_sum, counted $lost_total, lost $((lost_sum - lost_total))"
grep "will not be counted" "$CLUSTER_DIR/server.log" | sed 's/^/  log: /' | head -5 || true
# errors of the surviving servers' counters can only be timeouts (a flush's
# decrement that times out loses its amount)
victims_sql="$(printf "'%s'," $VICTIM_COUNTERS)"
psql -qXAt -d stress -c "SELECT 'RESULT stats: ' || string_agg(g || ' hits=' || h || ' rebuilds=' || r || ' fallbacks=' || f || ' errors=' || e || ' flushes=' || fl, '; ')
  FROM (SELECT CASE WHEN kind = 'sequence' THEN 'sequences'
                    WHEN name IN (${victims_sql%,}) THEN 'counters on the lost server'
                    ELSE 'counters on the surviving servers' END AS g,
               sum(hits) h, sum(rebuilds) r, sum(fallbacks) f, sum(errors) e, sum(flushes) fl
          FROM sharded_seq.memcached_stats GROUP BY 1 ORDER BY 1) s"
[ $bad = 0 ] || exit 1
[ "$n_surv" -gt 0 ] && [ "$n_lost" -gt 0 ]

# the restarted server is used again, and the keys have not moved
items=$(memcached_cmd "${MC_PORTS[$VICTIM]}" stats | sed -n 's/^STAT curr_items \([0-9]*\).*/\1/p')
echo "RESULT restarted server holds $items keys again"
[ "$items" -gt 0 ]
where >"$WORK/where.after"
# (a counter with no key now, having had nothing since its last flush, has not moved)
moved=$(awk 'NR == FNR { at[$1 " " $2] = $3; next }
             $1 == "counter" && $3 ~ /^[0-9]$/ && at[$1 " " $2] != $3' "$WORK/where" "$WORK/where.after" | wc -l)
echo "RESULT counter keys on another server than before the kill: $moved"
[ "$moved" = 0 ]
echo "RESULT took $(python3 -c "print(round($(date +%s.%N) - $start, 1))")s from the start of the load"

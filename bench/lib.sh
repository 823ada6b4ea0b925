# bench/lib.sh: throwaway PostgreSQL clusters and memcached servers on
# loopback, set up like a real server, for the benchmarks.  (Tests start
# their servers with PostgreSQL::Test::Cluster or pg_virtualenv: test/README.md.)
# Source it; it works as root (the cluster then runs as the postgres user,
# because PostgreSQL refuses root) and as a normal user.

# PG_MAJOR (set by scripts/chroot.sh) picks the
# PostgreSQL major; its client programs come first on PATH.  PGBIN, if set,
# names another installation's bin directory instead.
if [ -n "${PGBIN:-}" ]; then
    export PATH="$PGBIN:$PATH"
elif [ -n "${PG_MAJOR:-}" ]; then
    PGBIN="/usr/lib/postgresql/$PG_MAJOR/bin"
    export PATH="$PGBIN:$PATH"
else
    PGBIN="$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)"
fi

# Run a command as the user that owns the clusters (from /, which it can
# enter: root's working directory, such as /root, may be closed to it).
as_pg() {
    if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

# A free TCP port on 127.0.0.1.
free_port() {
    python3 - <<'PY'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
}

# cluster_create DIR: initdb a cluster in DIR/data listening on a free port.
# Exports PGHOST, PGPORT, PGUSER and PGDATA for psql, pgbench and pg_regress.
cluster_create() {
    local dir="$1"
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown -R postgres: "$dir"
    as_pg "$PGBIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 \
        --locale=C.UTF-8 --no-sync >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2; return 1; }
    PGPORT="$(free_port)"
    cat >>"$dir/data/postgresql.conf" <<CONF
port = $PGPORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
max_connections = 100
shared_buffers = 256MB
log_min_messages = warning
log_line_prefix = '%m [%p] '
CONF
    export PGHOST=127.0.0.1 PGPORT PGUSER=postgres PGDATA="$dir/data"
    export CLUSTER_DIR="$dir"
}

cluster_start() {
    as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -l "$CLUSTER_DIR/server.log" -w -t 60 start >/dev/null
}

# cluster_stop [fast|immediate]
# It and cluster_destroy do nothing without a cluster: exit traps call them
# before cluster_create too, under set -u, where "$PGDATA" unset would end
# the trap (|| true does not catch that) and skip the rest of its cleanup.
cluster_stop() {
    [ -n "${PGDATA:-}" ] || return 0
    as_pg "$PGBIN/pg_ctl" -D "$PGDATA" -m "${1:-fast}" -w -t 60 stop >/dev/null 2>&1 || true
}

cluster_destroy() {
    cluster_stop immediate
    if [ -n "${CLUSTER_DIR:-}" ]; then rm -rf "$CLUSTER_DIR"; fi
}

# Create a database with the extension (and pgTAP when asked).
db_create() {
    local db="$1"; shift
    psql -q -X -d postgres -c "CREATE DATABASE \"$db\"" >/dev/null
    psql -q -X -d "$db" -c "CREATE EXTENSION sharded_seq" >/dev/null
    for ext in "$@"; do psql -q -X -d "$db" -c "CREATE EXTENSION $ext" >/dev/null; done
}

# bench_cluster DIR: a cluster set up like a real server (fsync on, the WAL
# writer at its default), started, with a database "bench" holding the
# extension.  Removed on exit.
bench_cluster() {
    WORK="$1"
    trap 'cluster_destroy >/dev/null 2>&1; rm -rf "$WORK"' EXIT
    chmod 755 "$WORK"
    cluster_create "$WORK/pg"
    cluster_start
    db_create bench
}

# memcached_start PORT: a throwaway memcached on 127.0.0.1:PORT.
memcached_start() {
    local user=()
    [ "$(id -u)" = 0 ] && user=(-u memcache)
    memcached "${user[@]}" -l 127.0.0.1 -p "$1" -U 0 -m 64 -t 2 &
    MEMCACHED_PID=$!
    for _ in $(seq 1 50); do
        memcached_cmd "$1" version >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "memcached did not start on port $1"; return 1
}

# memcached_kill [SIGNAL]: stop the throwaway memcached.
memcached_kill() {
    [ -n "${MEMCACHED_PID:-}" ] || return 0
    kill "-${1:-TERM}" "$MEMCACHED_PID" 2>/dev/null || true
    wait "$MEMCACHED_PID" 2>/dev/null || true
    MEMCACHED_PID=""
}

# memcached_cmd PORT COMMAND: send one text-protocol command, print the reply.
memcached_cmd() {
    python3 - "$1" "$2" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
s.sendall(sys.argv[2].encode() + b"\r\n")
print(s.recv(4096).decode().strip())
PY
}

# median N...: the median of whole numbers (tps of several rounds)
median() { python3 -c "import statistics, sys; print(int(statistics.median(int(x) for x in sys.argv[1:])))" "$@"; }

# pratio CANDIDATE ANCHOR: over the caller's RUNS (space-separated figures
# per key, one per round), the median of the per-round ratios: the two were
# measured a minute apart in each round
pratio() {
    python3 - "${RUNS[$1]}" "${RUNS[$2]}" <<'PY'
import statistics, sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
print(f"{statistics.median(x / y for x, y in zip(a, b) if y):.2f}")
PY
}

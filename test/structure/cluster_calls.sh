#!/usr/bin/env bash
# Every administrative function reaches every node of a Citus cluster
# through one place: each of its returns is preceded by ClusterAdminRecord
# (src/topology/citus.c), and ClusterAdminRecord is called nowhere else.  A new
# administrative function, or a new return in one, that skips it would
# change one node only.
#
# The administrative functions come from the catalog, not from their names:
# docs/schema.sql is a fresh install's (scripts/schema.sh; versions/schema
# fails when it is stale).  Every function of the schema sharded_seq that is
# VOLATILE (pg_dump prints neither STABLE nor IMMUTABLE) and is not a
# trigger function changes state, and is administrative unless NOT_ADMIN
# below says why not.  Each must be a C function; its symbol (the AS clause)
# leads to its PG_FUNCTION_INFO_V1 definition anywhere under src/.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 - <<'PY'
import glob, re, sys

RECORD = "ClusterAdminRecord"
# Volatile functions of the schema that change no definition a Citus
# cluster keeps on every node, or are the propagation itself.  A function
# is added here only with its reason; one that no longer exists fails.
NOT_ADMIN = {
    # read only: volatile because they read shared memory, memcached or this
    # node's rows as they are now
    "buffered_slots": "reads the slot table",
    "counter_backlog": "reads write-behind amounts",
    "counter_pending": "reads write-behind amounts",
    "counter_node_value": "reads this node's rows",
    "memcached_servers": "probes the memcached servers",
    "memcached_stats_raw": "reads the counts of memcached events",
    "sequence_cache": "reads the node cache's counts",
    "sequence_usage": "reads a sequence's use on this server",
    "worker_status": "reads the workers' state",
    # engine paths: move amounts or rows within one node, never a definition
    "flush_counters": "moves this node's write-behind amounts into its rows",
    "maintain": "folds and gathers this node's rows, reaps retired shards",
    "node_counts": "flushes, then reads this node's counts (for move_node_counts)",
    # refused in a Citus cluster before they change anything
    "adopt_column": "refused in a Citus cluster (changes one node's table)",
    "release_column": "refused in a Citus cluster",
    "set_counter": "refused in a Citus cluster",
    # a cutover across logical replication is one server's, by design
    "cutover": "this server's cutover from its publisher",
    "cutover_stop": "stops this server",
    "cutover_source": "this server's part of a cutover",
    "cutover_resume": "undoes this server's stop",
    # the propagation itself
    "cluster_setup": "carries every definition to every node (the coordinator)",
    "cluster_sync": "replays the coordinator's calls on a worker",
    "move_node_counts": "carries its own call to the leaving node (ClusterCallOnGroup)",
    "take_node_counts": "the leaving node's part of move_node_counts, carried by it",
}

schema = open("docs/schema.sql").read()
blocks = re.split(r'\n--\n-- Name: ', schema)
functions = {}
for b in blocks:
    head = re.match(r'([^;]*); Type: FUNCTION; Schema: sharded_seq;', b)
    if not head:
        continue
    m = re.search(r'^CREATE FUNCTION sharded_seq\.(\w+)\((.*?)\) RETURNS (.*?)\n(.*?)(?:\n    AS |\n    AS \$)', b, re.S | re.M)
    if not m:
        print(f"FAILED: docs/schema.sql: cannot read the function {head.group(1)}")
        sys.exit(1)
    name, returns, attrs = m.group(1), m.group(3), m.group(4)
    sym = re.search(r"AS '\$libdir/sharded_seq', '(\w+)';", b)
    functions[name] = {
        "volatile": not re.search(r'\b(STABLE|IMMUTABLE)\b', attrs),
        "trigger": returns.strip() == "trigger",
        "c": bool(re.search(r'\bLANGUAGE c\b', attrs)),
        "symbol": sym.group(1) if sym else None,
    }
bad = []
if len(functions) < 10:
    bad.append(f"docs/schema.sql: only {len(functions)} functions of the schema sharded_seq found")
for name in NOT_ADMIN:
    if name not in functions:
        bad.append(f"NOT_ADMIN names {name}, which is not a function of the schema sharded_seq")
    elif not functions[name]["volatile"] or functions[name]["trigger"]:
        bad.append(f"NOT_ADMIN names {name}, which the rule leaves out already")
admin = sorted(n for n, f in functions.items()
               if f["volatile"] and not f["trigger"] and n not in NOT_ADMIN)

def strip_comments(t):
    t = re.sub(r'/\*.*?\*/', lambda m: '\n' * m.group(0).count('\n'), t, flags=re.S)
    return re.sub(r'//[^\n]*', '', t)

# every V1 function under src/: symbol -> (path, body)
defs, calls = {}, []
for path in sorted(glob.glob('src/**/*.c', recursive=True)):
    text = strip_comments(open(path).read())
    for m in re.finditer(r'PG_FUNCTION_INFO_V1\((\w+)\);\s*Datum\s*\n(\w+)\(PG_FUNCTION_ARGS\)\s*\n\{(.*?)\n\}\n', text, re.S):
        defs[m.group(1)] = (path, m.group(3))
    # every call of RECORD, and the function it sits in
    for c in re.finditer(r'\b' + RECORD + r'\s*\(', text):
        line_start = text.rfind('\n', 0, c.start()) + 1
        if c.start() == line_start:
            continue            # its definition (the name at the start of a line)
        fn = re.findall(r'^(\w+)\([^;{]*\)\s*\n\{', text[:c.start()], re.M)
        calls.append((path, fn[-1] if fn else '?'))

symbols = set()
for name in admin:
    f = functions[name]
    if not f["c"] or not f["symbol"]:
        bad.append(f"{name}: an administrative function that is not C cannot call {RECORD}: "
                   f"write it in C, or say in NOT_ADMIN why it is not administrative")
        continue
    if f["symbol"] not in defs:
        bad.append(f"{name}: no PG_FUNCTION_INFO_V1({f['symbol']}) under src/")
        continue
    symbols.add(f["symbol"])
    path, body = defs[f["symbol"]]
    who = f["symbol"] + ("" if f["symbol"] == name else f" (sharded_seq.{name})")
    returns = [r.start() for r in re.finditer(r'PG_RETURN_\w+\(|\breturn\b', body)]
    if not returns:
        bad.append(f"{path}: {who} has no return")
    for r in returns:
        before = body[:r].rstrip().splitlines()[-1] if body[:r].strip() else ""
        if RECORD + "(" not in before:
            bad.append(f"{path}: a return of {who} without {RECORD} just before it")
for path, fn in calls:
    if fn not in symbols:
        bad.append(f"{path}: {fn} calls {RECORD} but is not an administrative function")
for b in bad:
    print("FAILED:", b)
if bad:
    sys.exit(1)
print(f"RESULT {len(admin)} administrative functions of {len(functions)} in the schema sharded_seq "
      f"(volatile, not triggers, less {len(NOT_ADMIN)} listed): {' '.join(admin)}")
print(f"RESULT every return of each after {RECORD}; {len(calls)} calls, none elsewhere")
PY

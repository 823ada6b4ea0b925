#!/usr/bin/env bash
# Every administrative function reaches every node of a Citus cluster
# through one place: each of its returns is preceded by ClusterAdminRecord
# (src/topology/citus.c), as a statement of its own in the same block as the
# return (never under an if, never in a block the return is outside of), and
# ClusterAdminRecord is called nowhere else.  A new administrative function,
# or a new return in one, that skips it would change one node only.
#
# The functions come from the catalog, not from their names: docs/schema.sql
# is a fresh install's (scripts/schema.sh; versions/schema fails when it is
# stale).  Every function of the extension, in the schema sharded_seq and in
# the schema it is installed in (public there), whatever its volatility
# (a STABLE function can write too) and trigger or not, is administrative
# unless NOT_ADMIN below says why not.  An administrative function must be a
# C function; its symbol (the AS clause) leads to its PG_FUNCTION_INFO_V1
# definition anywhere under src/.  The check first proves on small inputs
# that it catches each kind of violation.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 - <<'PY'
import glob, re, sys

RECORD = "ClusterAdminRecord"
# Functions of the extension that change no definition a Citus cluster
# keeps on every node, or are the propagation itself.  A function is added
# here only with its reason; one that no longer exists fails.
NOT_ADMIN = {
    # the engine's own calls, in the schema the extension is installed in
    "sharded_nextval": "draws a value: the engine",
    "sharded_currval": "reads this session's last value",
    "counter_incr": "adds to a counter: the engine",
    "counter_value": "reads a counter's total",
    # readers of the schema sharded_seq, STABLE
    "counter_total": "reads a counter's total",
    "node_id": "reads this node's id",
    "node_value": "reads this node's part of a counter",
    "sequence_high_water": "reads a sequence's high-water mark",
    "sequence_readable": "checks a right to read a sequence",
    "replicated_tables": "lists the tables logical replication carries (SQL)",
    # trigger functions: fired by a change already made, on its node
    "claim_received": "trigger: a node claim arriving by replication",
    "cluster_call_arrived": "trigger: replays a call on a worker",
    "config_changed": "trigger: announces a configuration change",
    "config_replicated": "trigger: a configuration row arriving by replication",
    "rows_changed_elsewhere": "trigger: shard rows changed by another writer",
    "sequence_arrived": "trigger: a sequence row arriving by replication",
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

def read_functions(schema):
    """name -> what the dump says of each function of the extension."""
    functions, bad = {}, []
    for b in re.split(r'\n--\n-- Name: ', schema):
        head = re.match(r'([^;]*); Type: FUNCTION; Schema: (\w+);', b)
        if not head:
            continue
        m = re.search(r'^CREATE FUNCTION (\w+)\.(\w+)\((.*?)\) RETURNS (.*?)\n(.*?)(?:\n    AS |\n    AS \$)', b, re.S | re.M)
        if not m:
            bad.append(f"docs/schema.sql: cannot read the function {head.group(1)}")
            continue
        sym = re.search(r"AS '\$libdir/sharded_seq', '(\w+)';", b)
        functions[m.group(2)] = {
            "schema": m.group(1),
            "c": bool(re.search(r'\bLANGUAGE c\b', m.group(5))),
            "symbol": sym.group(1) if sym else None,
        }
    return functions, bad

def strip_comments(t):
    t = re.sub(r'/\*.*?\*/', lambda m: '\n' * m.group(0).count('\n'), t, flags=re.S)
    return re.sub(r'//[^\n]*', '', t)

def recorded_before(body, r):
    """Is the statement just before position r (a return) a call of RECORD
    of its own, in the same block (nothing but blanks between them)?"""
    end = body.rfind(';', 0, r)
    if end < 0 or body[end + 1:r].strip():
        return False
    start = max(body.rfind(';', 0, end), body.rfind('{', 0, end), body.rfind('}', 0, end)) + 1
    return re.match(r'\s*' + RECORD + r'\s*\(', body[start:end]) is not None

def check(schema, sources, not_admin):
    functions, bad = read_functions(schema)
    if len(functions) < 3:
        bad.append(f"docs/schema.sql: only {len(functions)} functions of the extension found")
    for name in not_admin:
        if name not in functions:
            bad.append(f"NOT_ADMIN names {name}, which is not a function of the extension")
    admin = sorted(n for n in functions if n not in not_admin)
    # every V1 function under src/: symbol -> (path, body)
    defs, calls = {}, []
    for path, raw in sorted(sources.items()):
        text = strip_comments(raw)
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
            bad.append(f"{f['schema']}.{name}: an administrative function that is not C cannot call {RECORD}: "
                       f"write it in C, or say in NOT_ADMIN why it is not administrative")
            continue
        if f["symbol"] not in defs:
            bad.append(f"{f['schema']}.{name}: no PG_FUNCTION_INFO_V1({f['symbol']}) under src/")
            continue
        symbols.add(f["symbol"])
        path, body = defs[f["symbol"]]
        who = f["symbol"] + ("" if f["symbol"] == name else f" ({f['schema']}.{name})")
        returns = [r.start() for r in re.finditer(r'PG_RETURN_\w+\(|\breturn\b', body)]
        if not returns:
            bad.append(f"{path}: {who} has no return")
        for r in returns:
            if not recorded_before(body, r):
                bad.append(f"{path}: a return of {who} without {RECORD}(...); as the statement just before it, in its block")
    for path, fn in calls:
        if fn not in symbols:
            bad.append(f"{path}: {fn} calls {RECORD} but is not an administrative function")
    return bad, functions, admin, calls

def fn_sql(schema, name, attrs='', lang='c'):
    return (f"\n--\n-- Name: {name}(); Type: FUNCTION; Schema: {schema}; Owner: -\n--\n\n"
            f"CREATE FUNCTION {schema}.{name}() RETURNS void\n    LANGUAGE {lang}{attrs}\n"
            f"    AS '$libdir/sharded_seq', '{name}';\n")

def fn_c(name, body):
    return f"PG_FUNCTION_INFO_V1({name});\nDatum\n{name}(PG_FUNCTION_ARGS)\n{{\n{body}\n}}\n"

def self_test():
    good_c = fn_c('make_it', '\tDoIt();\n\tif (done)\n\t{\n\t\tClusterAdminRecord(fcinfo, 0, "x");\n\t\tPG_RETURN_VOID();\n\t}\n'
                  '\tClusterAdminRecord(fcinfo, 0, "x");\n\tPG_RETURN_VOID();')
    reader_c = fn_c('read_it', '\tPG_RETURN_VOID();')
    base_sql = fn_sql('sharded_seq', 'make_it') + fn_sql('sharded_seq', 'read_it', ' STABLE') + fn_sql('public', 'draw')
    base_na = {'read_it': 'reads', 'draw': 'the engine'}
    cases = {
        'a STABLE function that writes, in neither list': (False, base_sql + fn_sql('sharded_seq', 'stable_write', ' STABLE'),
            {'a.c': good_c + reader_c + fn_c('stable_write', '\tWriteIt();\n\tPG_RETURN_VOID();')}, base_na),
        'a function of the other schema, in neither list': (False, base_sql + fn_sql('public', 'pub_write'),
            {'a.c': good_c + reader_c + fn_c('pub_write', '\tWriteIt();\n\tPG_RETURN_VOID();')}, base_na),
        'the call under an if': (False, base_sql,
            {'a.c': fn_c('make_it', '\tif (PG_NARGS() > 99) ClusterAdminRecord(fcinfo, 0, "x");\n\tPG_RETURN_VOID();') + reader_c}, base_na),
        'the call in a block the return is outside of': (False, base_sql,
            {'a.c': fn_c('make_it', '\tif (PG_NARGS() > 99)\n\t{\n\t\tClusterAdminRecord(fcinfo, 0, "x");\n\t}\n\tPG_RETURN_VOID();') + reader_c}, base_na),
        'a return with no call': (False, base_sql,
            {'a.c': fn_c('make_it', '\tif (x)\n\t\tPG_RETURN_VOID();\n\tClusterAdminRecord(fcinfo, 0, "x");\n\tPG_RETURN_VOID();') + reader_c}, base_na),
        'the call in a function that is not administrative': (False, base_sql,
            {'a.c': good_c + fn_c('read_it', '\tClusterAdminRecord(fcinfo, 0, "x");\n\tPG_RETURN_VOID();')}, base_na),
        'a listed name that does not exist': (False, base_sql, {'a.c': good_c + reader_c}, {**base_na, 'gone': 'x'}),
        'calls before each return, in their blocks (allowed)': (True, base_sql, {'a.c': good_c + reader_c}, base_na),
    }
    ok = True
    for what, (allowed, schema, sources, na) in cases.items():
        bad = check(schema, sources, na)[0]
        good = (not bad) == allowed
        print(f"self-test: {what}: {('passes' if allowed else 'caught') if good else 'WRONG: ' + '; '.join(bad or ['passed'])}")
        ok &= good
    return ok

if not self_test():
    print("FAILED: the check misses a kind of violation, or refuses a way that is allowed")
    sys.exit(1)
sources = {p: open(p).read() for p in glob.glob('src/**/*.c', recursive=True)}
bad, functions, admin, calls = check(open("docs/schema.sql").read(), sources, NOT_ADMIN)
for b in bad:
    print("FAILED:", b)
if bad:
    sys.exit(1)
print(f"RESULT {len(admin)} administrative functions of {len(functions)} of the extension "
      f"(in {', '.join(sorted({f['schema'] for f in functions.values()}))}; less {len(NOT_ADMIN)} listed): {' '.join(admin)}")
print(f"RESULT every return of each after {RECORD}, in its block; {len(calls)} calls, none elsewhere")
PY

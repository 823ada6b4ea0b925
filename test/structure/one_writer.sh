#!/usr/bin/env bash
# Every write of a counter shard row goes through ShardWrite in
# src/counter/rows.c, which marks the layout word first (the rule kept totals
# stand on, src/counter/layout.c):
#   - no heap write (heap_insert, heap_update, heap_delete, heap_multi_insert,
#     simple_heap_*, table_tuple_*, ShardedHeapUpdate, CatalogTuple*) outside
#     ShardWrite;
#   - no SQL text that names counter_shards (any spelling, or built with %s)
#     beside a write verb outside rows.c, and in rows.c only in functions
#     that run it through ShardRowsSql (which calls ShardWrite);
#   - ShardWrite's first statement marks the layout word.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 - <<'PY'
import glob, re, sys

def strip_comments(t):
    t = re.sub(r'/\*.*?\*/', lambda m: '\n' * m.group(0).count('\n'), t, flags=re.S)
    return re.sub(r'//[^\n]*', '', t)

def functions(text):
    """(name, body) of each function definition at the top level, whether its
    brace opens on the signature's line or the next."""
    out = []
    for m in re.finditer(r'^(?:[A-Za-z_][\w \t\*]*?[\s\*])?([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{', text, re.M | re.S):
        start = m.end() - 1
        depth, i = 0, start
        while i < len(text):
            if text[i] == '{': depth += 1
            elif text[i] == '}':
                depth -= 1
                if depth == 0: break
            i += 1
        out.append((m.group(1), text[start:i + 1]))
    return out

def literals(body):
    """The string literals of a body, adjacent ones joined as C joins them."""
    joined = re.sub(r'"\s*\n?\s*"', '', body)
    return re.findall(r'"((?:[^"\\\n]|\\.)*)"', joined)

HEAP = re.compile(r'\b(heap_insert|heap_update|heap_delete|heap_multi_insert|simple_heap_\w+|'
                  r'table_tuple_(insert|update|delete)|table_multi_insert|simple_table_tuple_\w+|'
                  r'ShardedHeapUpdate|CatalogTuple\w+)\s*\(')
VERB = re.compile(r'\b(INSERT|UPDATE|DELETE|COPY|TRUNCATE|MERGE)\b', re.I)
TABLE = re.compile(r'counter_shards\b', re.I)
bad = []
writers = 0
files = sorted(glob.glob('src/**/*.[ch]', recursive=True))
for path in files:
    text = strip_comments(open(path).read())
    funcs = functions(text)
    for name, body in funcs:
        for m in HEAP.finditer(body):
            if path == 'src/counter/rows.c' and name == 'ShardWrite':
                writers += 1
            elif path == 'src/common/compat.h' and name == 'ShardedHeapUpdate':
                pass            # the version shim ShardWrite calls
            else:
                bad.append(f"{path}: {name}() calls {m.group(1)} (only ShardWrite in src/counter/rows.c may write rows)")
        # an SQL text naming the shard table (by any spelling, or built with %s)
        # next to a write verb writes it
        for lit in literals(body):
            if TABLE.search(lit) and VERB.search(lit):
                if path != 'src/counter/rows.c':
                    bad.append(f"{path}: {name}() has SQL that may write counter_shards: {lit[:70]!r} "
                               f"(only src/counter/rows.c may, through ShardRowsSql)")
                elif 'ShardRowsSql(' not in body:
                    bad.append(f"{path}: {name}() writes counter_shards by SQL without ShardRowsSql")
                else:
                    writers += 1
    outside = text
    for _, body in funcs:
        outside = outside.replace(body, '')
    for m in HEAP.finditer(outside):
        if not (path == 'src/common/compat.h'):
            bad.append(f"{path}: {m.group(1)} outside any function (a macro?): only ShardWrite may write rows")
    for lit in literals(outside):
        if TABLE.search(lit) and VERB.search(lit):
            bad.append(f"{path}: SQL that may write counter_shards outside a function: {lit[:70]!r}")
rows = strip_comments(open('src/counter/rows.c').read())
sw = [b for n, b in functions(rows) if n == 'ShardWrite']
if len(sw) != 1:
    bad.append("src/counter/rows.c: no single ShardWrite function")
else:
    stmts = [s.strip() for s in sw[0][1:].split(';') if s.strip()]
    first = next((s for s in stmts if not re.match(r'^(ShardWriteOp|LockTupleMode|ShardedIndexUpdate|TM_Result|int)\s', s)), '')
    if not first.startswith('LayoutChanging(op->counter_id)'):
        bad.append(f"src/counter/rows.c: ShardWrite does not mark the layout word first (first statement: {first[:60]!r})")
for b in bad:
    print("FAILED:", b)
if bad:
    sys.exit(1)
print(f"RESULT {writers} writes of shard rows found in {len(files)} files, every one inside ShardWrite or through ShardRowsSql")
PY

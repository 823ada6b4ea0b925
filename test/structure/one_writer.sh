#!/usr/bin/env bash
# Every write of a counter shard row goes through ShardWrite in
# src/counter/rows.c, which marks the layout word first (the rule kept totals
# stand on, src/counter/layout.c):
#   - no heap write (heap_insert, heap_update, heap_delete, heap_multi_insert,
#     simple_heap_*, table_tuple_*, ShardedHeapUpdate, CatalogTuple*) outside
#     ShardWrite;
#   - no SQL that writes counter_shards outside rows.c, and in rows.c only in
#     functions that run it through ShardRowsSql (which calls ShardWrite);
#   - ShardWrite's first statement marks the layout word.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 - <<'PY'
import glob, re, sys

def functions(text):
    """(name, body) of each function definition at the top level."""
    out = []
    for m in re.finditer(r'^([A-Za-z_][A-Za-z0-9_]*)\([^;{]*?\)\s*\n\{', text, re.M | re.S):
        start = m.end() - 1
        depth, i = 0, start
        while True:
            if text[i] == '{': depth += 1
            elif text[i] == '}':
                depth -= 1
                if depth == 0: break
            i += 1
        out.append((m.group(1), text[start:i + 1], m.start()))
    return out

def strip_comments(t):
    return re.sub(r'/\*.*?\*/', lambda m: '\n' * m.group(0).count('\n'), t, flags=re.S)

HEAP = re.compile(r'\b(heap_insert|heap_update|heap_delete|heap_multi_insert|simple_heap_\w+|'
                  r'table_tuple_(insert|update|delete)|table_multi_insert|simple_table_tuple_\w+|'
                  r'ShardedHeapUpdate|CatalogTuple\w+)\s*\(')
# the table, qualified or not, quoted or not (in a C string: \")
TABLE = r'(\\?"?sharded_seq\\?"?\s*\.\s*)?\\?"?counter_shards\b'
SQL = re.compile(r'(INSERT\s+INTO|UPDATE|DELETE\s+FROM|COPY|TRUNCATE(\s+TABLE)?|MERGE\s+INTO)\s+(ONLY\s+)?' + TABLE, re.I)
bad = []
writers = 0
for path in sorted(glob.glob('src/**/*.c', recursive=True)):
    text = strip_comments(open(path).read())
    funcs = functions(text)
    for name, body, _ in funcs:
        for m in HEAP.finditer(body):
            if not (path == 'src/counter/rows.c' and name == 'ShardWrite'):
                bad.append(f"{path}: {name}() calls {m.group(1)} (only ShardWrite in src/counter/rows.c may write rows)")
            else:
                writers += 1
        for m in SQL.finditer(body):
            if path != 'src/counter/rows.c':
                bad.append(f"{path}: {name}() has SQL that writes counter_shards (only src/counter/rows.c may, through ShardRowsSql)")
            elif 'ShardRowsSql(' not in body:
                bad.append(f"{path}: {name}() writes counter_shards by SQL without ShardRowsSql")
            else:
                writers += 1
    # SQL outside any function body (a macro or a static string) counts too
    outside = text
    for _, body, _ in funcs:
        outside = outside.replace(body, '')
    for m in SQL.finditer(outside):
        bad.append(f"{path}: SQL that writes counter_shards outside a function")
rows = strip_comments(open('src/counter/rows.c').read())
sw = [b for n, b, _ in functions(rows) if n == 'ShardWrite']
if len(sw) != 1:
    bad.append("src/counter/rows.c: no single ShardWrite function")
else:
    stmts = [s.strip() for s in sw[0][1:].split(';') if s.strip()]
    first = next((s for s in stmts if not re.match(r'^(ShardWriteOp|LockTupleMode|ShardedIndexUpdate|int)\s', s)), '')
    if not first.startswith('LayoutChanging(op->counter_id)'):
        bad.append(f"src/counter/rows.c: ShardWrite does not mark the layout word first (first statement: {first[:60]!r})")
for b in bad:
    print("FAILED:", b)
if bad:
    sys.exit(1)
print(f"RESULT {writers} writes of shard rows found, every one inside ShardWrite or through ShardRowsSql")
PY

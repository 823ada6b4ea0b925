#!/usr/bin/env bash
# Every write of a counter shard row goes through ShardWrite in
# src/counter/rows.c, which marks the layout word first (the rule kept totals
# stand on, src/counter/layout.c).  ShardWrite is extern: any file of the
# folder may call it, and this check, not `static`, keeps every other way out:
#   - no heap write (heap_insert, heap_update, heap_delete, heap_multi_insert,
#     simple_heap_*, table_tuple_*, ShardedHeapUpdate, CatalogTuple*) in any
#     file of src/ outside ShardWrite;
#   - SQL that names counter_shards beside a write verb (adjacent literals
#     and a statement's literals joined, so a name put in with %s still
#     counts; FOR UPDATE/SHARE is a read) only as a plan prepared with
#     PreparePlan(&plan, ...) whose only other use is being handed to
#     ShardWrite (.plan = plan) or to a wrapper of the same file that hands
#     its first parameter to ShardWrite as a WRITE_SQL; never run directly;
#   - exactly one ShardWrite, in src/counter/rows.c, whose first statement
#     marks the layout word.
# It first proves on small files that it catches each kind of violation and
# lets the ways above through.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 - <<'PY'
import glob, os, re, sys, tempfile

WRITER_FILE = 'src/counter/rows.c'

def strip_comments(t):
    t = re.sub(r'/\*.*?\*/', lambda m: '\n' * m.group(0).count('\n'), t, flags=re.S)
    return re.sub(r'//[^\n]*', '', t)

def functions(text):
    """(name, parameters, body) of each function definition at the top
    level, whether its brace opens on the signature's line or the next."""
    out = []
    for m in re.finditer(r'^(?:[A-Za-z_][\w \t\*]*?[\s\*])?([A-Za-z_]\w*)\s*\(([^;{}]*)\)\s*\{', text, re.M | re.S):
        start = m.end() - 1
        depth, i = 0, start
        while i < len(text):
            if text[i] == '{': depth += 1
            elif text[i] == '}':
                depth -= 1
                if depth == 0: break
            i += 1
        out.append((m.group(1), m.group(2), text[start:i + 1]))
    return out

def statements(body):
    """The statements of a body, split at semicolons outside strings,
    character constants and parentheses."""
    out, cur, depth, i = [], [], 0, 0
    while i < len(body):
        c = body[i]
        if c in '"\'':
            j = i + 1
            while j < len(body) and body[j] != c:
                j += 2 if body[j] == '\\' else 1
            cur.append(body[i:j + 1])
            i = j + 1
            continue
        if c == '(': depth += 1
        elif c == ')': depth -= 1
        if c == ';' and depth == 0:
            out.append(''.join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    if ''.join(cur).strip():
        out.append(''.join(cur))
    return out

def sql_text(code):
    """The string literals of some code, joined (adjacent ones as C joins
    them, the others with a space)."""
    joined = re.sub(r'"\s*\n?\s*"', '', code)
    return ' '.join(re.findall(r'"((?:[^"\\\n]|\\.)*)"', joined))

HEAP = re.compile(r'\b(heap_insert|heap_update|heap_delete|heap_multi_insert|simple_heap_\w+|'
                  r'table_tuple_(insert|update|delete)|table_multi_insert|simple_table_tuple_\w+|'
                  r'ShardedHeapUpdate|CatalogTuple\w+)\s*\(')
VERB = re.compile(r'\b(INSERT|UPDATE|DELETE|COPY|TRUNCATE|MERGE)\b', re.I)
LOCKING = re.compile(r'\bFOR\s+(NO\s+KEY\s+UPDATE|UPDATE|KEY\s+SHARE|SHARE)\b', re.I)
TABLE = re.compile(r'(?<![\w$])counter_shards\b', re.I)

def writes_shards(code):
    text = LOCKING.sub(' ', sql_text(code))
    return bool(TABLE.search(text) and VERB.search(text))

def sql_wrappers(funcs):
    """Functions that hand their first parameter to ShardWrite as a WRITE_SQL plan."""
    out = set()
    for name, params, body in funcs:
        first = re.findall(r'(\w+)\s*$', params.split(',')[0])
        if first and 'ShardWrite(' in body and re.search(r'\.kind\s*=\s*WRITE_SQL\b', body) and \
                re.search(r'\.plan\s*=\s*' + re.escape(first[0]) + r'\b', body):
            out.add(name)
    return out

def check(root):
    bad, writers, sql_writes = [], [], 0
    files = sorted(glob.glob(os.path.join(root, 'src/**/*.[ch]'), recursive=True))
    for full in files:
        path = os.path.relpath(full, root)
        text = strip_comments(open(full).read())
        funcs = functions(text)
        wrappers = sql_wrappers(funcs)
        for name, _, body in funcs:
            if name == 'ShardWrite':
                writers.append((path, body))
            for m in HEAP.finditer(body):
                if path == WRITER_FILE and name == 'ShardWrite':
                    pass
                elif path == 'src/common/compat.h' and name == 'ShardedHeapUpdate':
                    pass            # the version shim ShardWrite calls
                else:
                    bad.append(f"{path}: {name}() calls {m.group(1)} (only ShardWrite in {WRITER_FILE} may write rows)")
            for st in statements(body):
                if not writes_shards(st):
                    continue
                m = re.match(r'\s*PreparePlan\s*\(\s*&\s*(\w+)\s*,', st)
                if not m:
                    bad.append(f"{path}: {name}() runs SQL that writes counter_shards other than as a "
                               f"plan ShardWrite runs: {sql_text(st)[:70]!r}")
                    continue
                plan = m.group(1)
                rest = body
                for ok in (r'PreparePlan\s*\(\s*&\s*' + plan + r'\s*,',
                           r'\bSPIPlanPtr\s+' + plan + r'\b',
                           r'\.plan\s*=\s*' + plan + r'\b',
                           *[r'\b' + w + r'\s*\(\s*' + plan + r'\s*,' for w in wrappers]):
                    rest = re.sub(ok, ' ', rest)
                if re.search(r'\b' + plan + r'\b', rest):
                    bad.append(f"{path}: {name}() uses plan {plan}, which writes counter_shards, other than "
                               f"by handing it to ShardWrite")
                elif not (re.search(r'\.plan\s*=\s*' + plan + r'\b', body) and 'ShardWrite(' in body) and \
                        not any(re.search(r'\b' + w + r'\s*\(\s*' + plan + r'\s*,', body) for w in wrappers):
                    bad.append(f"{path}: {name}() prepares plan {plan}, which writes counter_shards, "
                               f"and never hands it to ShardWrite")
                else:
                    sql_writes += 1
        outside = text
        for _, _, body in funcs:
            outside = outside.replace(body, '')
        for m in HEAP.finditer(outside):
            if path != 'src/common/compat.h':
                bad.append(f"{path}: {m.group(1)} outside any function (a macro?): only ShardWrite may write rows")
        for line in outside.replace('\\\n', ' ').splitlines():
            if writes_shards(line):
                bad.append(f"{path}: SQL that may write counter_shards outside a function: {sql_text(line)[:70]!r}")
    if [p for p, _ in writers] != [WRITER_FILE]:
        bad.append(f"ShardWrite must be defined once, in {WRITER_FILE} (found in: {[p for p, _ in writers]})")
    else:
        stmts = [s.strip() for s in writers[0][1][1:].split(';') if s.strip()]
        first = next((s for s in stmts if not re.match(r'^(ShardWriteOp|LockTupleMode|ShardedIndexUpdate|TM_Result|int)\s', s)), '')
        if not first.startswith('LayoutChanging(op->counter_id)'):
            bad.append(f"{WRITER_FILE}: ShardWrite does not mark the layout word first (first statement: {first[:60]!r})")
    return bad, len(files), sql_writes

WRITER = '''TM_Result
ShardWrite(const ShardWriteOp *op)
{
	int			rc;

	LayoutChanging(op->counter_id);
	heap_insert(op->rel, op->tuple, 0, 0, NULL);
	rc = SPI_execute_plan(op->plan, op->args, NULL, false, 0);
	return TM_Ok;
}
'''
WRAPPER = '''static void
ShardRowsSql(SPIPlanPtr plan, Datum *args, int expected, int32 id, const char *what)
{
	(void) ShardWrite(&(ShardWriteOp) {
		.kind = WRITE_SQL, .counter_id = id, .plan = plan, .args = args});
}
'''
def case(body, rows_extra=''):
    return {WRITER_FILE: WRITER + rows_extra, 'src/counter/other.c': WRAPPER + body}

SELF_TESTS = {
    'a heap_update outside ShardWrite': (False, case('void F(Relation r) { simple_heap_update(r, NULL, NULL); }')),
    'a heap_delete in the writer\'s file, outside ShardWrite':
        (False, case('', 'void G(Relation r) { heap_delete(r, NULL, 0, NULL, false, NULL, false); }')),
    'SQL run directly': (False, case('void F(void) { SPI_execute("DELETE FROM sharded_seq.counter_shards", false, 0); }')),
    'the table put in with %s': (False, case(
        'void F(void) { SPI_execute(psprintf("UPDATE %s SET value = 0", "sharded_seq.counter_shards"), false, 0); }')),
    'a writing plan also run directly': (False, case(
        'void F(void) { static SPIPlanPtr p = NULL; PreparePlan(&p, "DELETE FROM sharded_seq.counter_shards", 0, NULL);'
        ' ShardRowsSql(p, NULL, 0, 1, "x"); SPI_execute_plan(p, NULL, NULL, false, 0); }')),
    'a writing plan never handed to ShardWrite': (False, case(
        'void F(void) { static SPIPlanPtr p = NULL; PreparePlan(&p, "INSERT INTO sharded_seq.counter_shards VALUES (1)", 0, NULL); }')),
    'a writing SQL macro': (False, case('#define X "TRUNCATE sharded_seq.counter_shards"\n')),
    'a second ShardWrite': (False, {**case(''), 'src/counter/two.c': WRITER}),
    'ShardWrite not marking first': (False, {WRITER_FILE: WRITER.replace('\tLayoutChanging(op->counter_id);\n', '')
                                              + '\nvoid H(void) { LayoutChanging(1); }\n',
                                              'src/counter/other.c': WRAPPER}),
    'a plan through the wrapper (allowed)': (True, case(
        'void F(void) { static SPIPlanPtr p = NULL; Datum a[1];'
        ' PreparePlan(&p, "UPDATE sharded_seq.counter_shards SET value = 0", 0, NULL);'
        ' ShardRowsSql(p, a, SPI_OK_UPDATE, 1, "set"); }')),
    'a plan handed to ShardWrite itself (allowed)': (True, case(
        'void F(void) { static SPIPlanPtr q = NULL;'
        ' PreparePlan(&q, "DELETE FROM sharded_seq.counter_shards", 0, NULL);'
        ' (void) ShardWrite(&(ShardWriteOp) {.kind = WRITE_SQL, .plan = q}); }')),
    'a locking read run directly (allowed)': (True, case(
        'void F(void) { static SPIPlanPtr l = NULL;'
        ' PreparePlan(&l, "SELECT value FROM sharded_seq.counter_shards FOR UPDATE", 0, NULL);'
        ' SPI_execute_plan(l, NULL, NULL, false, 0); }')),
}

def self_test():
    ok = True
    for what, (allowed, tree) in SELF_TESTS.items():
        with tempfile.TemporaryDirectory() as d:
            for path, text in tree.items():
                os.makedirs(os.path.join(d, os.path.dirname(path)), exist_ok=True)
                open(os.path.join(d, path), 'w').write(text)
            bad, _, _ = check(d)
        good = (not bad) == allowed
        print(f"self-test: {what}: {('passes' if allowed else 'caught') if good else 'WRONG: ' + '; '.join(bad or ['passed'])}")
        ok &= good
    return ok

if not self_test():
    print("FAILED: the check misses a kind of violation, or refuses a way that is allowed")
    sys.exit(1)

bad, nfiles, sql_writes = check('.')
for b in bad:
    print("FAILED:", b)
if bad:
    sys.exit(1)
print(f"RESULT every heap write of shard rows in {nfiles} files is inside ShardWrite, "
      f"and {sql_writes} SQL writes go through it")
PY

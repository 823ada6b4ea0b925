#!/usr/bin/env bash
# Every write of a counter shard row goes through ShardWrite in
# src/counter/rows.c, which marks the layout word first (the rule kept totals
# stand on, src/counter/layout.c).  ShardWrite is extern: any file of the
# folder may call it, and this check, not `static`, keeps every other way out:
#   - no heap write (heap_insert, heap_update, heap_delete, heap_multi_insert,
#     heap_inplace_update, simple_heap_*, table_tuple_*, ShardedHeapUpdate,
#     CatalogTuple*, BeginCopyFrom/CopyFrom, ExecSimpleRelation*) named in any
#     file under src/ (whatever its extension; a README.md only when some file
#     #includes it) outside ShardWrite, not even as a macro's body, and no
#     rd_tableam (the table AM's own calls) outside the writer's file;
#   - the same read from the built objects (nm -u): only the writer's object
#     may reference those functions; another object that writes another
#     table with them needs a line of OBJECT_ALLOWED with the reason (none
#     today); an object missing or older than its .c or any header fails;
#   - a string literal naming counter_shards (adjacent literals joined, and
#     a macro that stands for literals expanded, also outside functions) only
#     in a plan ShardWrite runs (below), in a read (FROM or JOIN
#     counter_shards in a statement with no write verb), or in a use listed
#     in NAME_ALLOWED with its reason: a bare name kept in a variable
#     (DELETE FROM %s) fails;
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
import glob, os, re, subprocess, sys, tempfile
sys.path.insert(0, 'scripts')
from layers import stale_objects

WRITER_FILE = 'src/counter/rows.c'

def string_macros(texts):
    """Object-like macros whose body is string literals: name -> body."""
    out = {}
    for t in texts:
        for m in re.finditer(r'^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+((?:"(?:[^"\\\n]|\\.)*"[ \t]*(?:\\\n[ \t]*)?)+)$', t, re.M):
            out[m.group(1)] = m.group(2).replace('\\\n', ' ')
    return out

def expand(t, macros):
    for name, body in macros.items():
        t = re.sub(r'(?<!define )\b' + name + r'\b', lambda m: ' ' + body + ' ', t)
    return t

def blank_strings(t):
    """Code without the text of its string literals (a message may name a function)."""
    return re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', t)

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

# named at all (a macro may rename one without calling it)
WRITE_FUNCS = (r'heap_insert|heap_update|heap_delete|heap_multi_insert|heap_inplace_update|simple_heap_\w+|'
               r'table_tuple_(?:insert|update|delete|lock)|table_multi_insert|simple_table_tuple_\w+|'
               r'CatalogTuple\w+|BeginCopyFrom|CopyFrom|ExecSimpleRelation\w+')
HEAP = re.compile(r'\b(' + WRITE_FUNCS + r'|ShardedHeapUpdate|rd_tableam)\b')
SYMBOL = re.compile(r'^(?:' + WRITE_FUNCS + r')$')
# an object other than the writer's that references one: (object, symbol) -> why
OBJECT_ALLOWED = {}
# a use of the bare name counter_shards that is no write: (file, pattern) -> why
NAME_ALLOWED = {
    ('src/worker/hooks.c', r'ChangesOwnTable\s*\(\s*\w+\s*,\s*"counter_shards"\s*\)'):
        'a utility command on the table drops every kept total: a comparison with the name',
    ('src/common/catalog.c', r'\{\s*"counter_shards"\s*,\s*"rows_(?:changed|truncated)_elsewhere"'):
        'the firing modes of its triggers (ALTER TABLE ... ENABLE ALWAYS TRIGGER)',
    ('src/counter/rows.c', r'ConfigRelid\s*\(\s*"counter_shards"\s*\)|errhint\s*\("It is fired by changes to sharded_seq\.counter_shards'):
        'the writer\'s file: its relation id, and a trigger\'s hint',
    ('src/counter/sums.c', r'table_open\s*\(\s*ConfigRelid\s*\(\s*"counter_shards"\s*\)\s*,\s*AccessShareLock\s*\)'):
        'opened to sum the rows (AccessShareLock; a heap write would fail the other checks)',
    ('src/counter/apply.c', r'\w+\s*=\s*ConfigRelid\s*\(\s*"counter_shards"\s*\)'):
        'the relation id, for the rows it scans and hands to ShardWrite',
    ('src/counter/maintain.c', r'table_open\s*\(\s*ConfigRelid\s*\(\s*"counter_shards"\s*\)\s*,\s*RowExclusiveLock\s*\)'):
        'opened for the rows it hands to ShardWrite',
}
READ = re.compile(r'\b(?:FROM|JOIN)\s+(?:sharded_seq\s*\.\s*)?counter_shards\b', re.I)
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

def source_files(root):
    """Every file under src/ but objects; a .md only when a file #includes it."""
    files = [f for f in sorted(glob.glob(os.path.join(root, 'src/**/*'), recursive=True))
             if os.path.isfile(f) and not re.search(r'\.(o|bc|so)$', f)]
    texts = {f: open(f, errors='replace').read() for f in files}
    included = {os.path.basename(m) for t in texts.values()
                for m in re.findall(r'#\s*include\s*[<"]([^>"]+)[>"]', t)}
    return {f: t for f, t in texts.items() if not f.endswith('.md') or os.path.basename(f) in included}

def name_uses(path, st):
    """Uses of counter_shards in a statement's literals that are neither a
    read nor listed: what a write could be built from."""
    if not TABLE.search(sql_text(st)):
        return []
    rest = st
    for (f, pattern), _ in NAME_ALLOWED.items():
        if f == path:
            rest = re.sub(pattern, ' ', rest)
    # each run of adjacent literals: a whole read (SELECT or WITH ... FROM
    # counter_shards) in a statement with no write verb, or a use listed
    runs = re.findall(r'"((?:[^"\\\n]|\\.)*)"', re.sub(r'"\s*\n?\s*"', '', rest))
    reading = not VERB.search(LOCKING.sub(' ', sql_text(rest)))
    return [r for r in runs if TABLE.search(r) and
            not (reading and READ.search(r) and re.match(r'\s*\(?\s*(SELECT|WITH)\b', r, re.I))]

def check(root):
    bad, writers, sql_writes = [], [], 0
    sources = source_files(root)
    files = sorted(sources)
    macros = string_macros(strip_comments(t) for t in sources.values())
    for full in files:
        path = os.path.relpath(full, root)
        text = expand(strip_comments(sources[full]), macros)
        funcs = functions(text)
        wrappers = sql_wrappers(funcs)
        for name, _, body in funcs:
            if name == 'ShardWrite':
                writers.append((path, body))
            for m in HEAP.finditer(blank_strings(body)):
                if path == WRITER_FILE and name == 'ShardWrite':
                    pass
                elif path == WRITER_FILE and m.group(1) == 'rd_tableam':
                    pass
                elif path == 'src/common/compat.h' and name == 'ShardedHeapUpdate' and m.group(1) != 'ShardedHeapUpdate':
                    pass            # the version shim ShardWrite calls
                else:
                    bad.append(f"{path}: {name}() names {m.group(1)} (only ShardWrite in {WRITER_FILE} may write rows)")
            for st in statements(body):
                if not writes_shards(st):
                    for u in name_uses(path, st):
                        bad.append(f"{path}: {name}() names counter_shards in a literal that is no read: {u[:70]!r}")
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
        for m in HEAP.finditer(blank_strings(outside)):
            if path != 'src/common/compat.h' or m.group(1) in ('ShardedHeapUpdate', 'rd_tableam'):
                if m.group(1) != 'ShardedHeapUpdate' or not re.search(r'\bShardedHeapUpdate\s*\(', outside):
                    bad.append(f"{path}: {m.group(1)} outside any function (a macro?): only ShardWrite may write rows")
        directive = r'^[ \t]*#[^\n]*(?:\\\n[^\n]*)*'
        for st in re.findall(directive, outside, re.M) + statements(re.sub(directive, ';', outside, flags=re.M)):
            if writes_shards(st):
                bad.append(f"{path}: SQL that may write counter_shards outside a function: {sql_text(st)[:70]!r}")
            else:
                for u in name_uses(path, st):
                    bad.append(f"{path}: counter_shards named outside a function in a literal that is no read: {u[:70]!r}")
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
    # the escapes an adversarial review found in the check before
    'a statement split over lines at file scope': (False, case(
        'static const char *const Z =\n\t"UPDATE sharded_seq."\n\t"counter_shards SET value = 0";\n'
        'void F(void) { SPI_execute(Z, false, 0); }')),
    'the table\'s name in a variable': (False, case(
        'void F(void) { const char *t = "counter_shards"; SPI_execute(psprintf("DELETE FROM sharded_seq.%s", t), false, 0); }')),
    'a heap write renamed by a macro': (False, case(
        '#define RowInsert heap_insert\nvoid F(Relation r, HeapTuple t) { RowInsert(r, t, 0, 0, NULL); }')),
    'heap_inplace_update': (False, case('void F(Relation r, HeapTuple t) { heap_inplace_update(r, t); }')),
    'the table AM called directly': (False, case(
        'void F(Relation r, TupleTableSlot *s) { r->rd_tableam->tuple_insert(r, s, 0, 0, NULL); }')),
    'the table\'s name in a macro between literals': (False, case(
        '#define SHARDS "counter_shards"\nvoid F(void) { SPI_execute("UPDATE sharded_seq." SHARDS " SET value = 0", false, 0); }')),
    'COPY FROM in C': (False, case(
        'void F(Relation r) { CopyFromState cs = BeginCopyFrom(NULL, r, NULL, "/tmp/rows", false, NULL, NIL, NIL); (void) CopyFrom(cs); }')),
    'a heap write in an #included file of another extension': (False, {**case('#include "rows.inc"\n'),
        'src/counter/rows.inc': 'static void G(Relation r, HeapTuple t) { simple_heap_insert(r, t); }\n'}),
    'a read\'s tail kept apart from its verb': (False, case(
        'void F(void) { const char *v = "DELETE "; const char *t = "FROM sharded_seq.counter_shards";'
        ' SPI_execute(psprintf("%s%s", v, t), false, 0); }')),
    'a read of the table in a plan (allowed)': (True, case(
        'void F(void) { static SPIPlanPtr r = NULL;'
        ' PreparePlan(&r, "SELECT sum(value) FROM sharded_seq."\n "counter_shards WHERE counter_id = $1", 1, NULL);'
        ' SPI_execute_plan(r, NULL, NULL, true, 0); }')),
    'a message naming a heap function (allowed)': (True, case(
        'void F(int r) { elog(ERROR, "unexpected heap_update status %d", r); }')),
}

def check_objects(root):
    """Only the writer's object references a heap write function (nm -u)."""
    bad = stale_objects(os.path.join(root, 'src'))
    if bad:
        return bad
    writer = WRITER_FILE[:-2] + '.o'
    for o in sorted(glob.glob(os.path.join(root, 'src/**/*.o'), recursive=True)):
        path = os.path.relpath(o, root)
        out = subprocess.run(['nm', '-u', o], capture_output=True, text=True, check=True).stdout
        for sym in sorted({l.split()[-1] for l in out.splitlines() if l.strip()}):
            if SYMBOL.match(sym) and path != writer and (path, sym) not in OBJECT_ALLOWED:
                bad.append(f"{path} references {sym}: only {writer} may (or a line of OBJECT_ALLOWED saying why)")
    return bad

def self_test_objects():
    """The object check, on objects compiled here: a heap write in another
    object is caught, in the writer's passes, a stale object is caught."""
    ok = True
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, 'src/counter'))
        def build(path, body):
            c = os.path.join(d, path)
            open(c, 'w').write(body)
            subprocess.run(['cc', '-c', '-o', c[:-2] + '.o', c], check=True)
        build(WRITER_FILE, 'extern void heap_insert(void); void W(void) { heap_insert(); }\n')
        build('src/counter/other.c', 'void G(void) { }\n')
        good = not check_objects(d)
        print(f"self-test: objects: a heap write in the writer's object: {'passes' if good else 'WRONG'}")
        ok &= good
        build('src/counter/other.c', 'extern void heap_inplace_update(void); void G(void) { heap_inplace_update(); }\n')
        good = bool(check_objects(d))
        print(f"self-test: objects: heap_inplace_update in another object: {'caught' if good else 'WRONG: passed'}")
        ok &= good
        build('src/counter/other.c', 'extern int BeginCopyFrom(void); int G(void) { return BeginCopyFrom(); }\n')
        good = bool(check_objects(d))
        print(f"self-test: objects: BeginCopyFrom in another object: {'caught' if good else 'WRONG: passed'}")
        ok &= good
        build('src/counter/other.c', 'void G(void) { }\n')
        os.utime(os.path.join(d, 'src/counter/other.o'), (1, 1))
        good = any('run make first' in b for b in check_objects(d))
        print(f"self-test: objects: an object older than its .c: {'caught' if good else 'WRONG: passed'}")
        ok &= good
        os.remove(os.path.join(d, 'src/counter/other.o'))
        good = any('run make first' in b for b in check_objects(d))
        print(f"self-test: objects: an object missing: {'caught' if good else 'WRONG: passed'}")
        ok &= good
    return ok

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

if not (self_test() & self_test_objects()):
    print("FAILED: the check misses a kind of violation, or refuses a way that is allowed")
    sys.exit(1)

bad, nfiles, sql_writes = check('.')
bad += check_objects('.')
for b in bad:
    print("FAILED:", b)
if bad:
    sys.exit(1)
print(f"RESULT every heap write of shard rows in {nfiles} files is inside ShardWrite, "
      f"{sql_writes} SQL writes go through it, and only {WRITER_FILE[:-2]}.o references a heap write")
PY

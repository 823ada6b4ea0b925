#!/usr/bin/env bash
# Calls between the files of src/counter/ run down the order written at the
# top of src/counter/counter_internal.h ("admin.c > engine.c > ..."): a file
# calls (or reads a variable of) only files on a lower step, never one on its
# own step or above, so no two counter files need each other; slots.c, "below
# every user of it", calls no other counter file.  Read from the built objects
# (nm), as scripts/layers.py reads calls between folders, so the comment
# stays true; an object of src/ missing or older than its .c or any header
# fails (run make first).  It first proves on made-up calls that it catches each kind of
# violation.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 - <<'PY'
import glob, os, re, subprocess, sys

HEADER = 'src/counter/counter_internal.h'

def read_order(text):
    """The steps of the order, highest first, and the files below every user."""
    m = re.search(r'calls[\s*]+run[\s*]+down:(.*?)\(README\.md\)', text, re.S)
    if not m:
        return None, None
    words = re.sub(r'[\s*]+', ' ', m.group(1))
    chain, _, rest = words.partition(';')
    steps = [[f.strip() for f in step.split(',') if f.strip()] for step in chain.split('>')]
    leaves = re.findall(r'(\w+\.c)', rest)
    return steps, leaves

def check(steps, leaves, files, edges):
    """edges: (caller file, callee file, symbol)."""
    bad = []
    step = {f: i for i, s in enumerate(steps) for f in s}
    for f in files:
        if f not in step and f not in leaves:
            bad.append(f"{f} is not in the order in {HEADER}")
    for a, b, sym in edges:
        if a in leaves:
            bad.append(f"{a} uses {sym} of {b}: {a} is below every user of it and calls no counter file")
        elif b in leaves:
            continue
        elif a in step and b in step and step[b] <= step[a]:
            where = 'its own step' if step[b] == step[a] else 'a higher step'
            bad.append(f"{a} uses {sym} of {b}, on {where} of the order in {HEADER}")
    return bad

def self_test():
    steps = [['admin.c'], ['engine.c'], ['a.c', 'b.c'], ['rows.c']]
    leaves = ['slots.c']
    files = ['admin.c', 'engine.c', 'a.c', 'b.c', 'rows.c', 'slots.c']
    cases = {
        'a call up': [('rows.c', 'engine.c', 'F')],
        'a call sideways, on one step': [('a.c', 'b.c', 'F')],
        'a file calling itself a step up': [('engine.c', 'admin.c', 'V')],
        'the file below every user calling one': [('slots.c', 'rows.c', 'F')],
    }
    ok = True
    for what, edges in cases.items():
        bad = check(steps, leaves, files, edges)
        print(f"self-test: {what}: {'caught' if bad else 'MISSED'}")
        ok &= bool(bad)
    bad = check(steps, leaves, files + ['new.c'], [])
    print(f"self-test: a file not in the order: {'caught' if bad else 'MISSED'}")
    ok &= bool(bad)
    good = [('admin.c', 'engine.c', 'F'), ('admin.c', 'rows.c', 'F'), ('a.c', 'rows.c', 'F'),
            ('engine.c', 'slots.c', 'F'), ('rows.c', 'slots.c', 'F')]
    bad = check(steps, leaves, files, good)
    print(f"self-test: calls down the order: {'pass' if not bad else 'REFUSED: ' + '; '.join(bad)}")
    ok &= not bad
    sm, sl = read_order(' *	  calls run\n *	  down: x.c > y.c, z.c >\n *	  w.c; and s.c, below every user of it\n *	  (README.md).')
    parsed = sm == [['x.c'], ['y.c', 'z.c'], ['w.c']] and sl == ['s.c']
    print(f"self-test: the order is read from the comment: {'yes' if parsed else 'NO: ' + repr((sm, sl))}")
    return ok and parsed

if not self_test():
    print("FAILED: the check misses a kind of violation")
    sys.exit(1)
steps, leaves = read_order(open(HEADER).read())
if not steps:
    print(f"FAILED: {HEADER} has no order of calls (\"calls run down: ... (README.md)\")")
    sys.exit(1)
sys.path.insert(0, 'scripts')
from layers import stale_objects
stale = stale_objects('src')
for s in stale:
    print("FAILED:", s)
if stale:
    sys.exit(1)
objs = sorted(glob.glob('src/counter/*.o'))
files = [os.path.basename(p) for p in sorted(glob.glob('src/counter/*.c'))]
defined, needs = {}, {}
for o in objs:
    c = os.path.basename(o)[:-2] + '.c'
    out = subprocess.run(['nm', '-P', o], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        if parts[1] == 'U':
            needs.setdefault(c, set()).add(parts[0])
        elif parts[1] in 'TDBRCGS':
            defined[parts[0]] = c
edges = sorted({(a, defined[s], s) for a, syms in needs.items() for s in syms
                if s in defined and defined[s] != a})
bad = check(steps, leaves, files, edges)
for b in bad:
    print("FAILED:", b)
if bad:
    sys.exit(1)
print(f"RESULT {len(edges)} uses between {len(files)} counter files run down "
      f"{' > '.join(', '.join(s) for s in steps)} (and to {', '.join(leaves)})")
PY

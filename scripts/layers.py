#!/usr/bin/env python3
"""scripts/layers.py [--self-test] [--objects] [SRC_DIR]: check the layering
of src/ from its #include lines, and with --objects from the calls the built
objects (src/**/*.o) make to each other's symbols.

The subsystems and their layers, lowest first:
    common (0)  <  topology (1)  <  sequence, counter (2)  <  worker (3)
    <  module.c (4)
Rules:
  1. a file includes headers of its own folder or of a lower layer only
     (sequence and counter, on one layer, never include each other);
  2. from outside a folder, only its door is included: FOLDER/FOLDER.h;
  3. no include cycle, between files or between folders;
  4. an #include names a file literally ("x" or <x>), not through a macro;
  5. (--objects) an object calls only functions and reads only variables
     defined in its own folder or a lower layer;
  6. (--objects) no circle of calls between objects: two files never call
     each other's functions, directly or around a longer loop (a setting
     read in another file of the folder is not a call).
Prints each violation and exits 1; exits 0 when the tree keeps the rules.
"""
import os
import re
import sys
import tempfile

LAYERS = {"common": 0, "topology": 1, "sequence": 2, "counter": 2, "worker": 3, ".": 4}
INCLUDE = re.compile(r'^\s*#\s*include\s+["<]([^">]+)[">]', re.M)


def folder_of(path, src):
    rel = os.path.relpath(path, src)
    return rel.split(os.sep)[0] if os.sep in rel else "."


def check(src):
    problems = []
    files = []
    for root, _, names in os.walk(src):
        files += [os.path.join(root, n) for n in names
                  if not n.endswith((".o", ".bc", ".so", ".md"))]
    for f in files:
        if folder_of(f, src) not in LAYERS:
            problems.append(f"{os.path.relpath(f, src)}: folder is not a known subsystem "
                            f"(add it to LAYERS in scripts/layers.py with its layer)")
    edges = {}
    for f in sorted(files):
        here = folder_of(f, src)
        edges[f] = set()
        text = re.sub(r'/\*.*?\*/', ' ', open(f, encoding="utf-8", errors="replace").read(), flags=re.S)
        text = re.sub(r'//[^\n]*', '', text)
        for m in re.finditer(r'^\s*#\s*include\b(.*)$', text, re.M):
            if not re.match(r'\s*["<]', m.group(1)):
                problems.append(f"{os.path.relpath(f, src)}: #include{m.group(1)}: name the header literally")
        for inc in INCLUDE.findall(text):
            # our headers: next to the file, or under src/ (-I src)
            target = None
            for cand in (os.path.join(os.path.dirname(f), inc), os.path.join(src, inc)):
                if os.path.isfile(cand):
                    target = os.path.normpath(cand)
                    break
            if target is None:
                continue        # PostgreSQL's or the system's
            edges[f].add(target)
            there = folder_of(target, src)
            name = os.path.relpath(f, src)
            if there == here or there not in LAYERS or here not in LAYERS:
                continue
            if LAYERS[there] >= LAYERS[here]:
                problems.append(f"{name}: includes {inc}: {there} is not below {here}")
            door = os.path.join(src, there, there + ".h")
            if target != os.path.normpath(door):
                problems.append(f"{name}: includes {inc}: only {there}/{there}.h is the door of {there}")
    # cycles between files (depth-first search)
    state = {}

    def visit(f, stack):
        state[f] = 1
        for t in sorted(edges.get(f, ())):
            if state.get(t) == 1:
                cyc = stack[stack.index(t):] + [t] if t in stack else [f, t]
                problems.append("include cycle: " + " -> ".join(os.path.relpath(x, src) for x in cyc))
            elif t not in state:
                visit(t, stack + [t])
        state[f] = 2
    for f in sorted(edges):
        if f not in state:
            visit(f, [f])
    # cycles between folders
    fedges = {}
    for f, ts in edges.items():
        for t in ts:
            a, b = folder_of(f, src), folder_of(t, src)
            if a != b:
                fedges.setdefault(a, set()).add(b)
    for a in fedges:
        for b in fedges[a]:
            if a in fedges.get(b, ()) and a < b:
                problems.append(f"folders include each other: {a} <-> {b}")
    return problems, len(files)


def stale_objects(src):
    """What reads the objects must read today's: each .c under src has its
    .o, newer than the .c and than every .h under src, and no .o is left
    of a .c that is gone."""
    cs, newest_h = [], 0.0
    for root, _, names in os.walk(src):
        cs += [os.path.join(root, n) for n in names if n.endswith(".c")]
        newest_h = max([newest_h] + [os.path.getmtime(os.path.join(root, n)) for n in names if n.endswith(".h")])
    problems = []
    for root, _, names in os.walk(src):
        for n in names:
            if n.endswith(".o") and not os.path.exists(os.path.join(root, n[:-2] + ".c")):
                problems.append(f"{os.path.relpath(os.path.join(root, n), src)} has no .c (a moved or removed file): run make clean")
    for c in sorted(cs):
        o = c[:-2] + ".o"
        if not os.path.exists(o):
            problems.append(f"{os.path.relpath(o, src)} is missing: run make first")
        elif os.path.getmtime(o) < max(os.path.getmtime(c), newest_h):
            problems.append(f"{os.path.relpath(o, src)} is older than its .c or a header: run make first")
    return problems


def check_objects(src):
    """Calls between the built objects keep the layers too (rule 5)."""
    import subprocess
    objs = []
    for root, _, names in os.walk(src):
        objs += [os.path.join(root, n) for n in names if n.endswith(".o")]
    if not objs:
        return ["no objects under src/: build first (make)"], 0
    stale = stale_objects(src)
    if stale:
        return stale, len(objs)
    defined, needs, functions = {}, {}, set()
    for o in objs:
        out = subprocess.run(["nm", "-P", o], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            sym, kind = parts[0], parts[1]
            if kind == "U":
                needs.setdefault(o, set()).add(sym)
            elif kind in "TDBRCGS":
                defined[sym] = o
                if kind == "T":
                    functions.add(sym)
    problems = []
    uses = {}
    for o, syms in needs.items():
        here = folder_of(o, src)
        for sym in sorted(syms):
            if sym not in defined:
                continue
            if defined[sym] != o and sym in functions:
                uses.setdefault(o, {}).setdefault(defined[sym], sym)
            there = folder_of(defined[sym], src)
            if there != here and LAYERS.get(there, 9) >= LAYERS.get(here, -1):
                problems.append(f"{os.path.relpath(o, src)} uses {sym} of "
                                f"{os.path.relpath(defined[sym], src)}: {there} is not below {here}")
    # circles of calls between objects (rule 6), functions only: each reported once
    state, seen = {}, set()

    def visit(o, stack):
        state[o] = 1
        for t in sorted(uses.get(o, {})):
            if state.get(t) == 1:
                cyc = stack[stack.index(t):] + [t]
                key = frozenset(cyc)
                if key not in seen:
                    seen.add(key)
                    steps = [f"{os.path.relpath(a, src)} ({uses[a][b]})" for a, b in zip(cyc, cyc[1:])]
                    problems.append("call circle: " + " -> ".join(steps) + " -> "
                                    + os.path.relpath(cyc[-1], src))
            elif t not in state:
                visit(t, stack + [t])
        state[o] = 2
    for o in sorted(uses):
        if o not in state:
            visit(o, [o])
    return problems, len(objs)


def self_test():
    """The checker must catch each kind of violation."""
    cases = {
        "upward include": {"common/common.h": '#include "worker/worker.h"\n',
                           "worker/worker.h": '#include "common/common.h"\n'},
        "sideways include": {"common/common.h": "", "sequence/sequence.h": '#include "common/common.h"\n',
                             "counter/counter.h": '#include "sequence/sequence.h"\n'},
        "internal header from outside": {"common/common.h": "",
                                         "counter/counter.h": '#include "common/common.h"\n',
                                         "counter/counter_internal.h": '#include "counter/counter.h"\n',
                                         "worker/worker.c": '#include "counter/counter_internal.h"\n'},
        "file cycle": {"common/common.h": '#include "common/a.h"\n', "common/a.h": '#include "common/common.h"\n'},
        "unknown folder": {"misc/x.c": ""},
        "include through a macro": {"common/common.h": '#define W "worker/worker.h"\n#include W\n'},
        "include with a comment": {"common/common.h": '#include /* c */ "worker/worker.h"\n',
                                   "worker/worker.h": '#include "common/common.h"\n'},
        "upward include in another kind of file": {"common/common.h": '#include "common/up.inc"\n',
                                                   "common/up.inc": '#include "worker/worker.h"\n',
                                                   "worker/worker.h": ""},
        "upward include in angle brackets": {"common/common.h": "#include <worker/worker.h>\n",
                                             "worker/worker.h": '#include "common/common.h"\n'},
    }
    ok = True
    for what, tree in cases.items():
        with tempfile.TemporaryDirectory() as d:
            for path, text in tree.items():
                os.makedirs(os.path.join(d, os.path.dirname(path)), exist_ok=True)
                open(os.path.join(d, path), "w").write(text)
            problems, _ = check(d)
            print(f"self-test: {what}: {'caught' if problems else 'MISSED'}")
            ok &= bool(problems)
    ok &= self_test_objects()
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "common"))
        os.makedirs(os.path.join(d, "counter"))
        open(os.path.join(d, "common/common.h"), "w").write("")
        open(os.path.join(d, "counter/counter.h"), "w").write('#include "common/common.h"\n')
        open(os.path.join(d, "module.c"), "w").write('#include "counter/counter.h"\n')
        problems, _ = check(d)
        print(f"self-test: a tree that keeps the rules: {'passes' if not problems else 'REFUSED'}")
        ok &= not problems
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "counter"))
        for n in ("counter/a.c", "counter/a.o", "counter/b.c", "counter/b.o", "counter/counter.h"):
            open(os.path.join(d, n), "w").close()
        os.utime(os.path.join(d, "counter/counter.h"), (1, 1))
        os.utime(os.path.join(d, "counter/a.c"), (1, 1))
        os.utime(os.path.join(d, "counter/b.c"), (1, 1))
        fresh = not stale_objects(d)
        os.utime(os.path.join(d, "counter/b.o"), (0, 0))
        old = len(stale_objects(d)) == 1
        os.remove(os.path.join(d, "counter/b.o"))
        missing = len(stale_objects(d)) == 1
        os.utime(os.path.join(d, "counter/a.o"), (1, 1))
        os.utime(os.path.join(d, "counter/counter.h"), (2, 2))
        header = any("a.o is older" in p for p in stale_objects(d))
        for what, good in (("objects newer than their sources: pass", fresh), ("an object older than its .c: caught", old),
                           ("an object missing: caught", missing), ("an object older than a header: caught", header)):
            print(f"self-test: {what if good else 'WRONG: ' + what}")
            ok &= good
    return ok


def self_test_objects():
    """Rules 5 and 6 on objects compiled from small trees (needs cc)."""
    import shutil
    import subprocess
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("self-test: objects: no C compiler, not run")
        return True
    cases = {
        "upward call": ({"common/a.c": "int up(void); int a(void) { return up(); }",
                         "topology/t.c": "int up(void) { return 1; }"}, True),
        "call between the engines": ({"sequence/s.c": "int c(void); int s(void) { return c(); }",
                                      "counter/c.c": "int c(void) { return 1; }"}, True),
        "call circle between two files": ({"common/a.c": "int b(int); int a(int x) { return x ? b(x - 1) : 0; }",
                                           "common/b.c": "int a(int); int b(int x) { return x ? a(x - 1) : 1; }"}, True),
        "call circle around three files": ({"common/a.c": "int b(int); int a(int x) { return x ? b(x - 1) : 0; }",
                                            "common/b.c": "int c(int); int b(int x) { return x ? c(x - 1) : 1; }",
                                            "common/c.c": "int a(int); int c(int x) { return x ? a(x - 1) : 2; }"}, True),
        "an upward read of a variable": ({"common/a.c": "extern int v; int a(void) { return v; }",
                                          "worker/w.c": "int v = 1;"}, True),
        "calls that keep the rules": ({"common/a.c": "int a(void) { return 1; }",
                                       "topology/t.c": "int a(void); int t(void) { return a(); }",
                                       "counter/c.c": "int t(void); int a(void); int c(void) { return t() + a(); }",
                                       "module.c": "int c(void); int m(void) { return c(); }"}, False),
    }
    ok = True
    for what, (tree, bad) in cases.items():
        with tempfile.TemporaryDirectory() as d:
            for path, text in tree.items():
                os.makedirs(os.path.join(d, os.path.dirname(path)), exist_ok=True)
                open(os.path.join(d, path), "w").write(text + "\n")
                subprocess.run([cc, "-c", "-o", os.path.join(d, path[:-2] + ".o"), os.path.join(d, path)],
                               check=True)
            problems, _ = check_objects(d)
            if bad:
                print(f"self-test: {what}: {'caught' if problems else 'MISSED'}")
                ok &= bool(problems)
            else:
                print(f"self-test: {what}: {'passes' if not problems else 'REFUSED: ' + '; '.join(problems)}")
                ok &= not problems
    return ok


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--self-test":
        sys.exit(0 if self_test() else 1)
    objects = bool(args) and args[0] == "--objects"
    if objects:
        args = args[1:]
    src = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    problems, n = check(os.path.normpath(src))
    summary = f"{n} files checked"
    if objects:
        more, nobj = check_objects(os.path.normpath(src))
        problems += more
        summary += f", calls between {nobj} objects checked"
    for p in problems:
        print("LAYERING:", p)
    print(f"{summary}, {len(problems)} violations")
    sys.exit(1 if problems else 0)

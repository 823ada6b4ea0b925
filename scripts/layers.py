#!/usr/bin/env python3
"""scripts/layers.py [--self-test] [SRC_DIR]: check the layering of src/ from
its #include lines.

The subsystems and their layers, lowest first:
    common (0)  <  sequence, counter (1)  <  worker (2)  <  module.c (3)
Rules:
  1. a file includes headers of its own folder or of a lower layer only
     (sequence and counter, on one layer, never include each other);
  2. from outside a folder, only its door is included: FOLDER/FOLDER.h;
  3. no include cycle, between files or between folders.
Prints each violation and exits 1; exits 0 when the tree keeps the rules.
"""
import os
import re
import sys
import tempfile

LAYERS = {"common": 0, "sequence": 1, "counter": 1, "worker": 2, ".": 3}
INCLUDE = re.compile(r'^\s*#\s*include\s+["<]([^">]+)[">]', re.M)


def folder_of(path, src):
    rel = os.path.relpath(path, src)
    return rel.split(os.sep)[0] if os.sep in rel else "."


def check(src):
    problems = []
    files = []
    for root, _, names in os.walk(src):
        files += [os.path.join(root, n) for n in names if n.endswith((".c", ".h"))]
    for f in files:
        if folder_of(f, src) not in LAYERS:
            problems.append(f"{os.path.relpath(f, src)}: folder is not a known subsystem "
                            f"(add it to LAYERS in scripts/layers.py with its layer)")
    edges = {}
    for f in sorted(files):
        here = folder_of(f, src)
        edges[f] = set()
        for inc in INCLUDE.findall(open(f, encoding="utf-8").read()):
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
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "common"))
        os.makedirs(os.path.join(d, "counter"))
        open(os.path.join(d, "common/common.h"), "w").write("")
        open(os.path.join(d, "counter/counter.h"), "w").write('#include "common/common.h"\n')
        open(os.path.join(d, "module.c"), "w").write('#include "counter/counter.h"\n')
        problems, _ = check(d)
        print(f"self-test: a tree that keeps the rules: {'passes' if not problems else 'REFUSED'}")
        ok &= not problems
    return ok


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--self-test":
        sys.exit(0 if self_test() else 1)
    src = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    problems, n = check(os.path.normpath(src))
    for p in problems:
        print("LAYERING:", p)
    print(f"{n} files checked, {len(problems)} violations")
    sys.exit(1 if problems else 0)

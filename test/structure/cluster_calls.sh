#!/usr/bin/env bash
# Every administrative function (SQL functions create_*, alter_*, advance_*,
# drop_*, grant_*, revoke_* of sequences and counters) reaches every node of
# a Citus cluster through one place: each of its returns is preceded by
# ClusterAdminRecord (src/topology/citus.c), and ClusterAdminRecord is called
# nowhere else.  A new administrative function, or a new return in one, that
# skips it would change one node only.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 - <<'PY'
import re, sys

names = re.compile(r'^(create|alter|advance|drop|grant|revoke)_(sequence|counter)$')
found, bad = 0, []
for path in ("src/sequence/admin.c", "src/counter/admin.c"):
    text = open(path).read()
    for m in re.finditer(r'PG_FUNCTION_INFO_V1\((\w+)\);\s*Datum\s*\n(\w+)\(PG_FUNCTION_ARGS\)\s*\n\{(.*?)\n\}\n', text, re.S):
        fn, body = m.group(1), m.group(3)
        if not names.match(fn):
            if "ClusterAdminRecord" in body:
                bad.append(f"{path}: {fn} is not administrative but calls ClusterAdminRecord")
            continue
        found += 1
        returns = [r.start() for r in re.finditer(r'PG_RETURN_\w+\(|\breturn\b', body)]
        for r in returns:
            before = body[:r].rstrip().splitlines()[-1] if body[:r].strip() else ""
            if "ClusterAdminRecord(" not in before:
                bad.append(f"{path}: a return of {fn} without ClusterAdminRecord just before it")
        if not returns:
            bad.append(f"{path}: {fn} has no return")
if found != 11:
    bad.append(f"expected the 11 administrative functions, found {found}")
for b in bad:
    print("FAILED:", b)
if bad:
    sys.exit(1)
print(f"RESULT {found} administrative functions, every return after ClusterAdminRecord")
PY

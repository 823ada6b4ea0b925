#!/usr/bin/env python3
"""check_values.py FILE...: each FILE holds the values one session received,
one per line, in the order it received them.  Fails unless every value is
unique across all files (S1) and strictly increasing within each file (S2)."""
import sys
from collections import Counter

seen = Counter()
bad_order = 0
total = 0
for path in sys.argv[1:]:
    prev = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.lstrip("-").isdigit():
                continue
            v = int(line)
            total += 1
            seen[v] += 1
            if prev is not None and v <= prev:
                bad_order += 1
                if bad_order <= 5:
                    print(f"order: {path}: {v} after {prev}")
            prev = v
dups = {v: n for v, n in seen.items() if n > 1}
for v in list(dups)[:5]:
    print(f"duplicate: {v} handed out {dups[v]} times")
print(f"RESULT values={total} sessions={len(sys.argv) - 1} duplicates={len(dups)} out_of_order={bad_order}")
if total == 0:
    print("no values were collected")
    sys.exit(1)
sys.exit(1 if dups or bad_order else 0)

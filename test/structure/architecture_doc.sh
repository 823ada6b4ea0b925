#!/usr/bin/env bash
# docs/architecture.md names every source file (src/**/*.c, *.h) and no file
# that is gone; every subsystem folder has a README.md with its data flow,
# its invariants and the lock order.
set -euo pipefail
cd "$(dirname "$0")/../.."
doc=docs/architecture.md
[ -f "$doc" ] || { echo "FAILED: $doc is missing"; exit 1; }
fail=0
n=0
while IFS= read -r f; do
    n=$((n + 1))
    grep -q -- "$f" "$doc" || { echo "FAILED: $doc does not name $f"; fail=1; }
done < <(find src -name '*.c' -o -name '*.h' | sort)
for f in $(grep -o 'src/[A-Za-z0-9_/.-]*\.[ch]\b' "$doc" | sort -u); do
    [ -f "$f" ] || { echo "FAILED: $doc names $f, which does not exist"; fail=1; }
done
for d in src/*/; do
    r="${d}README.md"
    [ -f "$r" ] || { echo "FAILED: $r is missing"; fail=1; continue; }
    for section in "Data flow" "Invariants" "Lock order"; do
        grep -qi "^#.*$section" "$r" || { echo "FAILED: $r has no section \"$section\""; fail=1; }
    done
done
[ $fail = 0 ] || exit 1
echo "RESULT $doc names all $n source files; every subsystem has its README"

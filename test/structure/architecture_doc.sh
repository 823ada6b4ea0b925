#!/usr/bin/env bash
# docs/architecture.md names every source file (src/**/*.c, *.h, in any
# folder, new ones included) and no file that is gone, has a section for
# every folder of src/ at any depth, and names every install script
# (sharded_seq--*.sql); every folder of src/ has a README.md with its data flow, its invariants
# and the lock order; and the README's Debian package file names carry the
# control file's default_version.
set -euo pipefail
cd "$(dirname "$0")/../.."
doc=docs/architecture.md
[ -f "$doc" ] || { echo "FAILED: $doc is missing"; exit 1; }
fail=0
n=0
while IFS= read -r f; do
    n=$((n + 1))
    grep -qF -- "$f" "$doc" || { echo "FAILED: $doc does not name $f"; fail=1; }
done < <(find src -name '*.c' -o -name '*.h' | sort)
for f in $(grep -o 'src/[A-Za-z0-9_/.-]*\.[ch]\b' "$doc" | sort -u); do
    [ -f "$f" ] || { echo "FAILED: $doc names $f, which does not exist"; fail=1; }
done
folders=0
# every folder of src/ at any depth (src/counter/x/ needs its own section and README)
while IFS= read -r d; do
    d="$d/"
    folders=$((folders + 1))
    grep -q "^### \`${d}\`" "$doc" || { echo "FAILED: $doc has no section \"### \`$d\`\""; fail=1; }
    r="${d}README.md"
    [ -f "$r" ] || { echo "FAILED: $r is missing"; fail=1; continue; }
    for section in "Data flow" "Invariants" "Lock order"; do
        grep -qi "^#.*$section" "$r" || { echo "FAILED: $r has no section \"$section\""; fail=1; }
    done
done < <(find src -mindepth 1 -type d ! -name '.*' | sort)
scripts=0
for f in sharded_seq--*.sql; do
    scripts=$((scripts + 1))
    grep -qF -- "\`$f\`" "$doc" || { echo "FAILED: $doc does not name the install script $f"; fail=1; }
done
default="$(sed -n "s/^default_version *= *'\(.*\)'/\1/p" sharded_seq.control)"
debs="$(grep -o 'postgresql-[0-9NX]*-sharded-seq_[^_ ]*_[a-z0-9]*\.deb' README.md || true)"
[ -n "$debs" ] || { echo "FAILED: README.md names no Debian package file (postgresql-NN-sharded-seq_VERSION_ARCH.deb)"; fail=1; }
for d in $debs; do
    v="${d#*-sharded-seq_}"; v="${v%%_*}"
    [ "$v" = "$default" ] || { echo "FAILED: README.md names $d, but default_version is $default"; fail=1; }
done
[ $fail = 0 ] || exit 1
echo "RESULT $doc names all $n source files, a section for each of $folders folders, all $scripts install scripts; every subsystem has its README"
echo "RESULT README.md's Debian package files carry default_version $default: $(echo $debs)"

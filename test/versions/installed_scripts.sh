#!/usr/bin/env bash
# The installed install scripts and control file are this tree's, no more
# and no fewer: t/same_objects.pl and t/update.pl read the installed ones,
# and CREATE EXTENSION prefers a full script to the update chain, so a full
# script of a later version left installed from an older tree would be
# tested instead.  No cluster: it compares files.
set -euo pipefail
cd "$(dirname "$0")/../.."
ext="$("/usr/lib/postgresql/${PG_MAJOR:-15}/bin/pg_config" --sharedir)/extension"
installed="$(cd "$ext" && ls sharded_seq--*.sql 2>/dev/null | sort | tr '\n' ' ' || true)"
shipped="$(ls sharded_seq--*.sql | sort | tr '\n' ' ')"
echo "RESULT $ext holds: $installed"
[ "$installed" = "$shipped" ] || { echo "FAILED: $ext holds $installed; this tree ships $shipped (scripts/setup.sh removes the others)"; exit 1; }
for f in sharded_seq.control sharded_seq--*.sql; do
    cmp -s "$f" "$ext/$f" || { echo "FAILED: $ext/$f differs from the tree's"; exit 1; }
done

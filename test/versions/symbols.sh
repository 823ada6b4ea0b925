#!/usr/bin/env bash
# No function or variable the library exports has the name of one the server
# exports.  The dynamic linker resolves such a name to the server's, so a call
# meant for the extension's own code runs PostgreSQL's instead (1.3 nearly
# shipped a StatsShmemInit that re-initialised the server's statistics).
set -euo pipefail
PGBIN="/usr/lib/postgresql/${PG_MAJOR:-15}/bin"
lib="$("$PGBIN/pg_config" --pkglibdir)/sharded_seq.so"
[ -f "$lib" ] || { echo "no $lib"; exit 1; }
server="$(nm -D --defined-only "$PGBIN/postgres" | awk '{print $3}' | sed 's/@.*//' | sort -u)"
ours="$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort -u)"
clash="$(comm -12 <(echo "$server") <(echo "$ours"))"
echo "RESULT $(echo "$ours" | wc -l) symbols exported by $lib, $(echo "$server" | wc -l) by the server; clashes: ${clash:-none}"
[ -z "$clash" ]

#!/usr/bin/env bash
# docs/schema.sql is today's schema: scripts/schema.sh writes it again from a
# fresh install in a throwaway pg_virtualenv cluster, and any difference
# fails (a changed install or upgrade script, a new version, without the
# file written again).  PostgreSQL 15 only: pg_dump and the catalogs print
# a little differently on each major, and the committed file is 15's; on
# another major the test skips.  The installed build must be this tree's,
# as versions/installed_scripts checks (scripts/test.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/../.."
MAJOR="${PG_MAJOR:-15}"
if [ "$MAJOR" != 15 ]; then
    echo "SKIP docs/schema.sql is PostgreSQL 15's; this is $MAJOR"
    exit 77
fi
now="$(mktemp /tmp/ssq_schema_now.XXXXXX)"
trap 'rm -f "$now"' EXIT
scripts/schema.sh "$now"
if ! diff -u docs/schema.sql "$now" >"$now.diff"; then
    head -n 80 "$now.diff"; rm -f "$now.diff"
    echo "FAILED: docs/schema.sql is stale (above: - committed, + a fresh install); run scripts/schema.sh and commit it"
    exit 1
fi
rm -f "$now.diff"
echo "RESULT docs/schema.sql is a fresh install's: $(grep -c '^CREATE FUNCTION' docs/schema.sql) functions, $(grep -c '^CREATE TABLE' docs/schema.sql) tables, $(grep -c '^CREATE VIEW' docs/schema.sql) views, $(grep -c '^CREATE TRIGGER' docs/schema.sql) triggers"

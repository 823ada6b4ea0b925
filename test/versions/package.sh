#!/usr/bin/env bash
# The Debian package for this PostgreSQL major (PG_MAJOR): build it with
# dpkg-buildpackage (pg_buildext, whose build runs the pg_regress suite),
# install it, run its autopkgtest (debian/tests/installcheck) against the
# installed files, and create and use the extension in a fresh cluster.
# Afterwards the package is removed and the build from source that
# scripts/setup.sh installed is put back.  Needs root (it installs a package).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
SRC="$(cd "$HERE/../.." && pwd)"
MAJOR="${PG_MAJOR:-15}"
# pg_virtualenv (the build's and the autopkgtest's installcheck) must not
# see the one scripts/test.sh runs in
unset PGHOST PGPORT PGUSER PGDATABASE PGPASSWORD PGSYSCONFDIR PG_CLUSTER_CONF_ROOT
PKG="postgresql-$MAJOR-sharded-seq"
if [ "$(id -u)" != 0 ]; then
    echo "SKIP installing a package needs root"
    exit 77
fi

# the packaging tools: scripts/setup.sh installs them (scripts/test.sh runs
# it first); a test installs nothing itself
need=()
for p in build-essential dpkg-dev debhelper fakeroot libmemcached-dev postgresql-server-dev-all postgresql-all; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "missing packages: ${need[*]}; scripts/setup.sh installs them"
    exit 1
fi

# the kind of build scripts/setup.sh made (with wait points or not), to put back
WAIT_POINTS_BUILT=""
[ "$(cat "$SRC/.wait_points" 2>/dev/null)" = on ] && WAIT_POINTS_BUILT=1
WORK="$(mktemp -d /tmp/ss_package.XXXXXX)"
chmod 755 "$WORK"
# Every step runs whatever failed before (set -e and -u are off here), and
# the test's own status is kept.
restore() {
    local status=$? ok=1
    set +eu
    if dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep -q "install ok installed"; then
        dpkg -r "$PKG" >/dev/null 2>&1 || { echo "cleanup: could not remove $PKG"; ok=0; }
    fi
    make -s -C "$SRC" install WAIT_POINTS="$WAIT_POINTS_BUILT" PG_CONFIG="/usr/lib/postgresql/$MAJOR/bin/pg_config" >/dev/null ||
        { echo "cleanup: could not put back the build from source"; ok=0; }
    rm -rf "$WORK"
    [ $ok = 1 ] || [ $status != 0 ] || status=1
    exit $status
}
trap restore EXIT

version="$(dpkg-parsechangelog -l "$SRC/debian/changelog" -S Version)"
tree="$WORK/sharded-seq-$version"
mkdir -p "$tree"
tar -C "$SRC" --exclude=./.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
    --exclude=./results --exclude=./log --exclude=./tmp_check --exclude=./regression.diffs \
    --exclude=./regression.out --exclude=./debian/.debhelper --exclude="./debian/$PKG" -cf - . |
    tar -C "$tree" -xf -

echo "==> dpkg-buildpackage -us -uc (PostgreSQL $MAJOR)"
(cd "$tree" && PG_UPDATECONTROL=yes pg_buildext updatecontrol >/dev/null &&
    dpkg-buildpackage -us -uc) >"$WORK/build.log" 2>&1 || {
    grep -v "^\(gcc\|/usr/bin/clang\|/usr/bin/install\|/bin/mkdir\)" "$WORK/build.log" | tail -n 50; exit 1; }
grep -E '^(test|ok|not ok) ' "$WORK/build.log" | sed 's/^/    build-time installcheck: /'
deb="$(ls "$WORK/${PKG}_${version}"_*.deb)"
echo "RESULT built $(basename "$deb")"
dpkg -c "$deb" >"$WORK/contents.txt"
grep -q "usr/lib/postgresql/$MAJOR/lib/sharded_seq.so$" "$WORK/contents.txt"
grep -q "usr/share/postgresql/$MAJOR/extension/sharded_seq.control$" "$WORK/contents.txt"
# a normal build has no wait points (only test builds, make WAIT_POINTS=1)
dpkg-deb -x "$deb" "$WORK/unpacked"
waits="$(nm -D --defined-only "$WORK/unpacked/usr/lib/postgresql/$MAJOR/lib/sharded_seq.so" | grep -c WaitPoint || true)"
echo "RESULT wait point symbols in the package's sharded_seq.so: $waits"
[ "$waits" = 0 ] || { echo "the package was built with wait points"; exit 1; }
# the install scripts: the base and its update chain, exactly those shipped
packaged="$(grep -o "usr/share/postgresql/$MAJOR/extension/sharded_seq--.*\.sql$" "$WORK/contents.txt" | sed 's,.*/,,' | sort | tr '\n' ' ')"
shipped="$(cd "$SRC" && ls sharded_seq--*.sql | sort | tr '\n' ' ')"
echo "RESULT install scripts in the package: $packaged"
[ "$packaged" = "$shipped" ] || { echo "the package's install scripts are not the tree's: $shipped"; exit 1; }

echo "==> installing it"
dpkg -i "$deb" >"$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log"; exit 1; }
owner="$(dpkg -S "/usr/lib/postgresql/$MAJOR/lib/sharded_seq.so" | cut -d: -f1)"
echo "RESULT sharded_seq.so belongs to $owner"
[ "$owner" = "$PKG" ]

echo "==> its autopkgtest, debian/tests/installcheck"
(cd "$tree" && debian/tests/installcheck) >"$WORK/autopkgtest.log" 2>&1 || { tail -n 60 "$WORK/autopkgtest.log"; exit 1; }
grep -E '^(test|ok|not ok) ' "$WORK/autopkgtest.log" | sed 's/^/    autopkgtest: /'
grep -Eq '^# All [0-9]+ tests passed|^ All [0-9]+ tests passed' "$WORK/autopkgtest.log"

echo "==> CREATE EXTENSION in a fresh cluster (pg_virtualenv, as the autopkgtest)"
cat >"$WORK/use.sql" <<'SQL'
CREATE DATABASE pkg;
\c pkg
CREATE EXTENSION sharded_seq;
SELECT sharded_seq.create_sequence('ids');
SELECT count(DISTINCT v) FROM (SELECT sharded_nextval('ids') AS v FROM generate_series(1, 5000)) s;
SELECT counter_incr('c', 40) + counter_incr('c', 2);
SELECT extversion FROM pg_extension WHERE extname = 'sharded_seq';
SQL
(cd "$WORK" && pg_virtualenv -v "$MAJOR" psql -qXAt -v ON_ERROR_STOP=1 -d postgres -f use.sql -o out.txt) \
    >"$WORK/virtualenv.log" 2>&1 || { cat "$WORK/virtualenv.log"; exit 1; }
out="$(cat "$WORK/out.txt")"
default="$(sed -n "s/^default_version *= *'\(.*\)'/\1/p" "$SRC/sharded_seq.control")"
echo "RESULT from the package: $(echo $out)"
[ "$(echo $out)" = "5000 82 $default" ]

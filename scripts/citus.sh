#!/usr/bin/env bash
# scripts/citus.sh: build Citus for the tests of sharded_seq on a Citus
# cluster (t/citus.pl, bench/citus.sh) and install it into PostgreSQL 15.
# Citus is a test dependency only: nothing of it is linked into or shipped
# with sharded_seq.  Citus is not in Debian; its release tarball and the
# patch 13.2.2 needs on PostgreSQL 15.20 are in ../shared/citus (or
# $SHARDED_SEQ_CITUS_DIR).  The built tree is cached under
# /var/cache/sharded_seq, so a second run only installs (about 6 minutes
# the first time on 2 cores, a few seconds after).  Without the sources it
# says so and exits 0: the tests then skip.  Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=13.2.2
PG_MAJOR="${PG_MAJOR:-15}"
PG_CONFIG="/usr/lib/postgresql/$PG_MAJOR/bin/pg_config"
src_dir="${SHARDED_SEQ_CITUS_DIR:-$(pwd)/../shared/citus}"
tarball="$src_dir/citus-$VERSION.tar.gz"
cache=/var/cache/sharded_seq/citus-$VERSION-pg$PG_MAJOR

if [ "$PG_MAJOR" != 15 ]; then
    echo "==> Citus tests run on PostgreSQL 15 only: not building Citus for $PG_MAJOR"
    exit 0
fi
if [ ! -f "$tarball" ]; then
    echo "==> no Citus sources ($tarball): the Citus tests will skip"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "==> scripts/citus.sh needs root to install Citus: the Citus tests will skip"
    exit 0
fi
pg_version="$("$PG_CONFIG" --version)"
if [ -f "$("$PG_CONFIG" --pkglibdir)/citus.so" ] && [ -f "$cache/.installed" ] &&
   [ "$(cat "$cache/.installed")" = "$pg_version" ]; then
    exit 0
fi

need=()
for pkg in libcurl4-openssl-dev liblz4-dev libzstd-dev libkrb5-dev libssl-dev libselinux1-dev \
           libxslt1-dev libpam0g-dev libreadline-dev autoconf flex bison make gcc; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "==> installing Citus's build dependencies: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ ! -f "$cache/.built" ] || [ "$(cat "$cache/.built")" != "$pg_version" ]; then
    echo "==> building Citus $VERSION for $pg_version (once; cached in $cache)"
    rm -rf "$cache"
    mkdir -p "$cache"
    tar xzf "$tarball" -C "$cache" --strip-components=1
    if [ -f "$src_dir/citus-$VERSION-pg15.20.patch" ]; then
        (cd "$cache" && patch -s -p1 < "$src_dir/citus-$VERSION-pg15.20.patch")
    fi
    (cd "$cache" && ./configure -q PG_CONFIG="$PG_CONFIG" >/dev/null && make -s -j2 >/dev/null 2>&1) ||
        { echo "==> building Citus failed (see $cache)" >&2; exit 1; }
    echo "$pg_version" > "$cache/.built"
fi
(cd "$cache" && make -s install >/dev/null 2>&1)
echo "$pg_version" > "$cache/.installed"
echo "==> Citus $VERSION installed"

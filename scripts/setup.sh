#!/usr/bin/env bash
# scripts/setup.sh: install what is missing on Debian/Ubuntu, then build and
# install the extension.  Safe to run again; it installs nothing twice.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "scripts/setup.sh needs root to install packages and the extension:" >&2
        echo "run it as root, or install sudo and give this user sudo rights." >&2
        exit 1
    fi
    SUDO="sudo"
fi

# PG_MAJOR picks the PostgreSQL major (default 15, the host's; scripts/chroot.sh
# sets 17 or 18 in its chroots).
PG_MAJOR="${PG_MAJOR:-15}"
PG_CONFIG="/usr/lib/postgresql/$PG_MAJOR/bin/pg_config"
contrib=()
[ "$PG_MAJOR" = 15 ] && contrib=(postgresql-contrib)
# Everything any test needs, so that scripts/test.sh passes on a bare Debian
# (minbase) with nothing else installed: the server, headers and build tools;
# memcached and its tools; pgTAP and pg_prove; python3 (free ports,
# memcached probes, mcproxy); and what
# test/versions/package.sh builds the Debian package with (debian/control's
# Build-Depends, build-essential that dpkg-checkbuilddeps requires, and
# fakeroot).  scripts/chroot.sh's PACKAGES holds the same for 17 and 18.
need=()
for pkg in postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR "${contrib[@]}" libmemcached-dev \
           libmemcached-tools memcached postgresql-$PG_MAJOR-pgtap \
           libtap-parser-sourcehandler-pgtap-perl libipc-run-perl make gcc python3 \
           build-essential debhelper dpkg-dev fakeroot postgresql-server-dev-all postgresql-all; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "==> installing: ${need[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian starts a memcached service on 11211; tests use their own ports.

# t/monitoring.pl runs Prometheus's postgres_exporter with the queries users
# are given (docs/monitoring/): its binary, unpacked from the Debian package
# rather than installed, so that no exporter service starts.  Best effort:
# without it that part of the test is skipped.
EXPORTER_DIR=/usr/local/lib/sharded_seq-test
if [ ! -x "$EXPORTER_DIR/prometheus-postgres-exporter" ] && [ "$(id -u)" = 0 ]; then
    tmp="$(mktemp -d)"
    chmod 755 "$tmp"
    if (cd "$tmp" && apt-get download -qq prometheus-postgres-exporter >/dev/null 2>&1 &&
        dpkg-deb -x prometheus-postgres-exporter_*.deb x); then
        mkdir -p "$EXPORTER_DIR"
        cp "$tmp/x/usr/bin/prometheus-postgres-exporter" "$EXPORTER_DIR/"
    else
        echo "==> prometheus-postgres-exporter not available: t/monitoring.pl skips the exporter" >&2
    fi
    rm -rf "$tmp"
fi


export PATH="/usr/lib/postgresql/$PG_MAJOR/bin:$PATH"
echo "==> building for PostgreSQL $PG_MAJOR"
make -s clean PG_CONFIG="$PG_CONFIG" >/dev/null
# with libmemcached (installed above), or stop: the tests need it
make -s WERROR="${WERROR:-}" WAIT_POINTS="${WAIT_POINTS:-}" MEMCACHED="${MEMCACHED:-1}" PG_CONFIG="$PG_CONFIG" >/dev/null
echo "==> installing the extension"
# make install adds files and removes none.  An install script this tree
# does not ship (such as a full sharded_seq--X.sql from before the scripts
# became the base 1.0 and its update chain) would stay installed, and CREATE
# EXTENSION prefers a full script to the chain: remove every one it lacks.
for f in "$("$PG_CONFIG" --sharedir)"/extension/sharded_seq--*.sql; do
    if [ -e "$f" ] && [ ! -e "${f##*/}" ]; then $SUDO rm -f "$f"; fi
done
$SUDO make -s install MEMCACHED="${MEMCACHED:-1}" PG_CONFIG="$PG_CONFIG" >/dev/null

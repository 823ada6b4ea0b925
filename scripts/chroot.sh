#!/usr/bin/env bash
# scripts/chroot.sh SUITE [COMMAND [ARGS...]]: run COMMAND (default: an
# interactive shell) in a Debian SUITE chroot that holds that suite's
# PostgreSQL server and headers, libmemcached, memcached, pgTAP, pg_prove and
# the Debian packaging tools, with a fresh copy of this source tree in
# /build/sharded_seq (the working directory).
#
#   SUITE   trixie (PostgreSQL 17) or sid (PostgreSQL 18); 17 and 18 work too.
#
# The chroot is made once with debootstrap in
# $SHARDED_SEQ_CHROOTS/chroot-SUITE (default /var/cache/sharded_seq) and
# reused afterwards; apt-get runs again only when a package is missing.  Runs
# on one chroot wait for each other.  /proc,
# /dev and /dev/shm are mounted while COMMAND runs, and unmounted afterwards.
# In the chroot, PG_MAJOR is set to the suite's PostgreSQL major, which
# scripts/setup.sh, scripts/test.sh and bench/lib.sh follow.
#
# Needs root.  Examples:
#   scripts/chroot.sh trixie scripts/test.sh            # the suite on 17
#   scripts/chroot.sh sid dpkg-buildpackage -us -uc -b  # the package for 18
set -euo pipefail
ROOT_DIR="$(cd "$(dirname "$0")/.." && pwd)"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CACHE="${SHARDED_SEQ_CHROOTS:-/var/cache/sharded_seq}"

suite="${1:?usage: scripts/chroot.sh trixie|sid [COMMAND...]}"
shift
case "$suite" in
    trixie|17) suite=trixie; major=17 ;;
    sid|unstable|18) suite=sid; major=18 ;;
    *) echo "scripts/chroot.sh: unknown suite '$suite' (trixie or sid)" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "scripts/chroot.sh needs root (debootstrap, chroot, mount)" >&2; exit 1; }

CH="$CACHE/chroot-$suite"
# One run per chroot at a time: each replaces /build/sharded_seq, and the
# first to finish would unmount /proc under the other.
mkdir -p "$CACHE"
exec 9>"$CACHE/chroot-$suite.lock"
flock 9
# sid's Release file may be past its Valid-Until on the mirror.
APT_OPTS=(-o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false)
PACKAGES=(postgresql-$major postgresql-server-dev-$major postgresql-server-dev-all
          postgresql-$major-pgtap libtap-parser-sourcehandler-pgtap-perl libipc-run-perl
          libmemcached-dev libmemcached-tools memcached make gcc python3
          build-essential debhelper dpkg-dev fakeroot ca-certificates postgresql-all)

log() { echo "==> [$suite] $*" >&2; }

mounted=()
unmount_all() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount "${mounted[$i]}" 2>/dev/null || umount -l "${mounted[$i]}" 2>/dev/null || true
    done
    mounted=()
}
trap unmount_all EXIT
mount_all() {
    local target
    for spec in "proc proc" "/dev dev" "/dev/shm dev/shm"; do
        set -- $spec
        target="$CH/$2"
        mkdir -p "$target"
        mountpoint -q "$target" && continue      # another run holds it mounted
        if [ "$1" = proc ]; then mount -t proc proc "$target"; else mount --bind "$1" "$target"; fi
        mounted+=("$target")
    done
}
in_chroot() {
    chroot "$CH" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/root LANG=C.UTF-8 LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive \
        PG_MAJOR="$major" TERM="${TERM:-dumb}" "$@"
}

# 1. The base system, made once.  A half-made chroot is never reused: it is
#    built aside and moved into place when debootstrap has finished.
if [ ! -f "$CH/.sharded_seq-base" ]; then
    command -v debootstrap >/dev/null 2>&1 || {
        log "installing debootstrap"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    }
    mkdir -p "$CACHE"
    tmp="$CH.partial"
    rm -rf "$tmp"
    log "debootstrap $suite from $MIRROR (once; a few minutes)"
    debootstrap --variant=minbase "$suite" "$tmp" "$MIRROR" >"$CACHE/debootstrap-$suite.log" 2>&1 || {
        tail -n 30 "$CACHE/debootstrap-$suite.log" >&2; exit 1; }
    # No services start inside the chroot; the clusters the tests need
    # are their own, and no default cluster is made.
    printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
    chmod 755 "$tmp/usr/sbin/policy-rc.d"
    mkdir -p "$tmp/etc/postgresql-common/createcluster.d"
    echo "create_main_cluster = false" >"$tmp/etc/postgresql-common/createcluster.d/sharded_seq.conf"
    echo "deb $MIRROR $suite main" >"$tmp/etc/apt/sources.list"
    touch "$tmp/.sharded_seq-base"
    mv "$tmp" "$CH"
fi

mount_all

# 2. The packages, installed when one is missing (a reused chroot skips this).
missing=()
for p in "${PACKAGES[@]}"; do
    in_chroot dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing: ${missing[*]}"
    in_chroot apt-get "${APT_OPTS[@]}" update -qq
    in_chroot apt-get "${APT_OPTS[@]}" install -y -qq "${missing[@]}" >"$CACHE/apt-$suite.log" 2>&1 || {
        tail -n 30 "$CACHE/apt-$suite.log" >&2; exit 1; }
fi
[ -x "$CH/usr/lib/postgresql/$major/bin/postgres" ] || {
    echo "scripts/chroot.sh: $suite has no PostgreSQL $major server" >&2; exit 1; }

# 3. A fresh copy of the source tree (never the host's build products).
rm -rf "$CH/build/sharded_seq"
mkdir -p "$CH/build/sharded_seq"
tar -C "$ROOT_DIR" --exclude=./.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
    --exclude=./results --exclude=./log --exclude=./tmp_check --exclude=./output_iso \
    --exclude=./output-preloaded --exclude=./output_iso-preloaded \
    --exclude=./regression.diffs --exclude=./regression.out -cf - . |
    tar -C "$CH/build/sharded_seq" -xf -

if [ $# = 0 ]; then set -- bash; fi
status=0
in_chroot bash -c 'cd /build/sharded_seq && exec "$@"' chroot.sh "$@" || status=$?
exit $status

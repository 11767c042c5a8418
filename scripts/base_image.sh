#!/usr/bin/env bash
# Build the image's base without a registry (`make base-image`): a minimal Debian bookworm made
# by debootstrap from Debian's mirror, imported as $KFS_BASE_IMAGE (default kfs-base:bookworm).
# Idempotent: an existing image is kept unless KFS_REBUILD_BASE=1. Needs root (or sudo) and the
# daemon (`make docker`). Its python3 is Debian's 3.11; the Dockerfile installs it.
set -euo pipefail
SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
DOCKER=${DOCKER:-docker}
IMAGE=${KFS_BASE_IMAGE:-kfs-base:bookworm}
SUITE=${KFS_BASE_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

if [ "${KFS_REBUILD_BASE:-0}" != 1 ] && $SUDO "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "base-image: $IMAGE exists (KFS_REBUILD_BASE=1 builds it again)"
  exit 0
fi
root=$(mktemp -d "${TMPDIR:-/var/tmp}/kfs-base-XXXXXX")
trap '$SUDO rm -rf "$root"' EXIT
echo "base-image: debootstrap --variant=minbase $SUITE from $MIRROR"
$SUDO debootstrap --variant=minbase "$SUITE" "$root/rootfs" "$MIRROR" >"$root/debootstrap.log" 2>&1 \
  || { tail -n 20 "$root/debootstrap.log" >&2; exit 1; }
# The suite's updates and security archives, as Debian's own images list them; no package
# cache or package lists in the image (the Dockerfile runs apt-get update itself).
$SUDO tee "$root/rootfs/etc/apt/sources.list" >/dev/null <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
SOURCES
$SUDO rm -rf "$root"/rootfs/var/cache/apt/archives/*.deb "$root"/rootfs/var/cache/apt/*.bin \
  "$root"/rootfs/var/lib/apt/lists/* "$root"/rootfs/var/log/* "$root"/rootfs/tmp/*
$SUDO tar -C "$root/rootfs" --numeric-owner -c . \
  | $SUDO "$DOCKER" import --change 'CMD ["bash"]' - "$IMAGE" >/dev/null
echo "base-image: $IMAGE ($($SUDO "$DOCKER" image inspect --format '{{.Size}}' "$IMAGE") bytes)"

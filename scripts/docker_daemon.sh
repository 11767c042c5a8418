#!/usr/bin/env bash
# Install Debian's Docker engine (docker.io) and debootstrap, and start the daemon when none
# answers: `make docker`. Idempotent; needs root (or sudo). The daemon runs without a container
# bridge or iptables rules (--bridge=none --iptables=false): the images are built and run with
# --network host only, every test address on loopback (docs/production-deployment.md,
# "Building the image offline"). Storage: overlay2, else fuse-overlayfs, else vfs (slow, always
# works). The daemon's log: $KFS_DOCKERD_LOG (default /var/log/kfs-dockerd.log).
set -euo pipefail
SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
DOCKER=${DOCKER:-docker}
LOG=${KFS_DOCKERD_LOG:-/var/log/kfs-dockerd.log}

have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
if ! have dockerd || ! have debootstrap; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    docker.io debootstrap
fi

if $SUDO "$DOCKER" info >/dev/null 2>&1; then
  echo "docker: the daemon answers ($($SUDO "$DOCKER" version --format '{{.Server.Version}}'))"
  exit 0
fi

for driver in ${KFS_DOCKER_STORAGE_DRIVERS:-overlay2 fuse-overlayfs vfs}; do
  echo "docker: starting dockerd (storage driver $driver; log $LOG)"
  $SUDO setsid /usr/sbin/dockerd --iptables=false --ip6tables=false --bridge=none \
    --storage-driver="$driver" >>"$LOG" 2>&1 </dev/null &
  pid=$!
  for _ in $(seq 1 60); do
    if $SUDO "$DOCKER" info >/dev/null 2>&1; then
      echo "docker: the daemon answers ($($SUDO "$DOCKER" version --format '{{.Server.Version}}'), pid $pid)"
      exit 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  echo "docker: dockerd did not start with $driver:" >&2
  tail -n 5 "$LOG" >&2
done
echo "docker: no storage driver worked (log $LOG)" >&2
exit 1

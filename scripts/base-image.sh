#!/usr/bin/env bash
# Build the base image of every testbed image from Debian packages, for machines with no image
# registry (this VM, CI): debootstrap a bookworm root, then `docker import` it.
# It stands in for the default base, python:3.11-slim-bookworm: Python 3.11 with venv, plus the
# few tools the role images use. Usage: scripts/base-image.sh [TAG]   (default gdtb/base:bookworm)
# Skips the build when TAG exists; FORCE=1 rebuilds. Needs root, debootstrap and a Docker engine.
set -euo pipefail
TAG=${1:-gdtb/base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if docker image inspect "$TAG" >/dev/null 2>&1 && [ "${FORCE:-0}" != 1 ]; then echo "$TAG exists (FORCE=1 rebuilds)"; exit 0; fi
[ "$(id -u)" -eq 0 ] || { echo "debootstrap needs root" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "debootstrap not found: apt-get install debootstrap" >&2; exit 1; }
root=$(mktemp -d /var/tmp/gdtb-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
# bash and net-tools: Containernet drives hosts through bash and ifconfig
debootstrap --variant=minbase \
  --include=python3,python3-venv,iproute2,iptables,iputils-ping,procps,net-tools,ca-certificates \
  bookworm "$root" "$MIRROR" >"$root.log" 2>&1 || { tail -5 "$root.log" >&2; exit 1; }
rm -f "$root.log"
# Containernet's pty shell chokes on bash 5.2's bracketed-paste escapes (seen here: its commands never return)
echo "set enable-bracketed-paste off" >> "$root/etc/inputrc"
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/tmp/*
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["bash"]' - "$TAG" >/dev/null
echo "built $TAG ($(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}'))"

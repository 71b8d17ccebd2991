#!/usr/bin/env bash
# Install the Debian packages the emulator (and the report test's browser) needs, only what is missing, as root.
# Usage: scripts/sysdeps.sh [--check] [--docker]
#   --check: report what is missing and exit 1 if anything is
#   --docker: also the container backends' packages (Docker engine, debootstrap for the base image)
set -euo pipefail
check=0; docker=0
for a in "$@"; do case "$a" in --check) check=1 ;; --docker) docker=1 ;; *) echo "unknown option $a" >&2; exit 2 ;; esac; done
need=()
have() { command -v "$1" >/dev/null 2>&1; }
have ip        || need+=(iproute2)
have iptables  || need+=(iptables)
have iperf3    || need+=(iperf3)
[ -e /usr/lib/x86_64-linux-gnu/libiperf.so.0 ] || [ -e /lib/x86_64-linux-gnu/libiperf.so.0 ] || \
  ldconfig -p 2>/dev/null | grep -q libiperf.so.0 || need+=(libiperf0)
have ping      || need+=(iputils-ping)
have mnexec    || need+=(mininet)
have brctl     || need+=(bridge-utils)
have ethtool   || need+=(ethtool)
have pkill     || need+=(procps)
ldconfig -p 2>/dev/null | grep -q "libpcap.so" || need+=(libpcap0.8)  # scapy compiles capture filters with it
have chromium  || need+=(chromium)   # headless: the report.html test renders the page (tests/test_report.py)
if [ $docker -eq 1 ]; then
  have dockerd     || need+=(docker.io)
  have debootstrap || need+=(debootstrap)
fi
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ $check -eq 1 ]; then echo "missing Debian packages: ${need[*]}"; exit 1; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "the emulator needs these Debian packages: ${need[*]}; run as root (or: sudo apt-get install ${need[*]})" >&2
  exit 1
fi
echo "installing Debian packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null

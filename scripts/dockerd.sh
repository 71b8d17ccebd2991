#!/usr/bin/env bash
# Start or stop a Docker engine by hand, for machines without systemd (this VM, CI).
# Usage: scripts/dockerd.sh start|stop|status
#
# The testbed's containers use `--network none` and get their links from us, so the engine is
# started without its own networking (--iptables=false --bridge=none): dockerd's default
# `iptables -P FORWARD DROP` would otherwise break every Linux bridge in the root namespace
# (Mininet's switches). An engine that is already running (systemd, Docker Desktop) is used as it is.
set -euo pipefail
RUN=/run/gdtb-dockerd
cmd=${1:-status}
running() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }
case "$cmd" in
  start)
    if running; then echo "a Docker engine is already running"; exit 0; fi
    command -v dockerd >/dev/null || { echo "dockerd not found: apt-get install docker.io (Debian) and retry" >&2; exit 1; }
    mkdir -p "$RUN"
    # setsid: the engine outlives this script and ignores the caller's Ctrl-C
    setsid dockerd --iptables=false --bridge=none --pidfile "$RUN/dockerd.pid" >"$RUN/dockerd.log" 2>&1 < /dev/null &
    for _ in $(seq 1 60); do running && { echo "dockerd started (log: $RUN/dockerd.log)"; exit 0; }; sleep 0.5; done
    echo "dockerd did not come up; see $RUN/dockerd.log" >&2; exit 1 ;;
  stop)
    [ -f "$RUN/dockerd.pid" ] || { echo "no dockerd started by this script"; exit 0; }
    pid=$(cat "$RUN/dockerd.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || { echo "dockerd stopped"; exit 0; }; sleep 0.5; done
    echo "dockerd ($pid) did not stop" >&2; exit 1 ;;
  status)
    if running; then docker version --format 'Docker engine {{.Server.Version}} is running'; else echo "no Docker engine"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac

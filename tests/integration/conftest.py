"""Integration tests build real topologies: root, iproute2, iptables, iperf3 (`make sysdeps`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

MISSING = [t for t in ("ip", "tc", "iptables", "iperf3", "ping") if not shutil.which(t)]
needs_root = pytest.mark.skipif(os.geteuid() != 0 or bool(MISSING),
                                reason=f"needs root and {', '.join(MISSING) or 'iproute2'} (run `make sysdeps`)")


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
            item.add_marker(needs_root)


# Prefixes of other emulations sharing this machine (e.g. another developer's runs), comma-separated:
# what carries them is not this test's to account for. Empty in CI.
FOREIGN = tuple(p for p in os.environ.get("GDTB_TEST_FOREIGN_PREFIXES", "").split(",") if p)


def command_lines() -> dict[str, str]:
    """pid -> command line of every other process on the machine (those that exit while read are left out)."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                out[d.name] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
    return out


def assert_wan_rtt(st: dict, one_way_ms: float, where: object) -> None:
    """A ping over one WAN link took its configured round trip.

    The NFQUEUE delay line releases early by the wake-up lateness it has learned (emu/delayline.py), so a packet
    may leave a fraction of a millisecond before its deadline; on average they leave on time."""
    cfg = 2 * one_way_ms
    assert cfg - 1.0 <= st["rtt_min_ms"] and cfg - 0.5 <= st["rtt_avg_ms"] <= cfg + 10, (where, st)


def snapshot() -> dict[str, set[str]]:
    """What a run could leave behind: namespaces, root links, root iptables rules, our processes."""
    def out(argv):
        return subprocess.run(argv, capture_output=True, text=True).stdout

    def mine(item: str) -> bool:
        return not FOREIGN or not any(f in item for f in FOREIGN)

    procs = {f"{pid} {cmd}" for pid, cmd in command_lines().items()
             if "testbed.emu" in cmd or "mininet:gdtb" in cmd or "iperf3" in cmd}
    snap = {
        "netns": {ln.split()[0] for ln in out(["ip", "netns", "list"]).splitlines() if ln.strip()},
        "links": {ln.split(": ")[1].split("@")[0] for ln in out(["ip", "-o", "link"]).splitlines()},
        "iptables": {ln for ln in out(["iptables-save"]).splitlines() if not ln.startswith(("#", ":"))},
        "procs": procs,
    }
    return {k: {x for x in v if mine(x)} for k, v in snap.items()}


def snapshot_of(prefix: str) -> dict[str, set[str]]:
    """What `snapshot` holds of one prefix (other runs may come and go on a shared machine meanwhile)."""
    return {k: {x for x in v if prefix in x} for k, v in snapshot().items()}


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def write_topology(path: Path, *, gbps: float = 0.1, latency: float = 10.0, window_mb: float = 16,
                   hosts: int = 1, name: str = "t2") -> Path:
    path.write_text(f"""
name: {name}
tcp_window_mb: {window_mb}
dcs:
  - {{name: east, gpus: 8, hosts: {hosts}}}
  - {{name: west, gpus: 8, hosts: {hosts}}}
links:
  - {{between: [east, west], gbps: {gbps}, latency_ms: {latency}}}
""")
    return path

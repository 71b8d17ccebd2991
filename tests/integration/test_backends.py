"""The Mininet backend for real; Containernet where it is installed."""

from __future__ import annotations

import itertools
import shutil

import pytest

from testbed.emu.backends.containernet import containernet_available
from testbed.emu.build import down, up
from testbed.emu.check import ping
from testbed.spec.load import load_topology
from tests.conftest import ROOT
from tests.integration.conftest import assert_wan_rtt, snapshot

try:
    import mininet.net  # noqa: F401

    HAVE_MININET = bool(shutil.which("mnexec"))
except ImportError:
    HAVE_MININET = False


@pytest.mark.skipif(not HAVE_MININET, reason="Mininet not installed (pip install '.[mininet]' and Debian's mininet)")
def test_mininet_backend_builds_3dc_and_leaves_nothing():
    before = snapshot()
    emu = up(load_topology(ROOT / "topologies" / "3dc.yaml"), backend="mininet", prefix="gdtbn", scale=2000)
    try:
        for a, b in itertools.permutations(emu.addr.hosts, 2):
            out = emu.backend.run(emu.node(a.ns), ["ping", "-n", "-c", "1", "-W", "3", b.ip], check=False)
            assert " 0% packet loss" in out
        for link in emu.topo.links:
            x, y = link.between
            st = ping(emu, f"{x}-h0", emu.addr.host(f"{y}-h0").ip, 10)
            assert_wan_rtt(st, link.latency_ms, link.between)
    finally:
        down(emu)
    assert snapshot() == before


@pytest.mark.skipif(containernet_available() is not None, reason=f"containernet: {containernet_available()}")
def test_containernet_backend_builds_and_leaves_nothing():
    before = snapshot()
    emu = up(load_topology(ROOT / "topologies" / "3dc.yaml"), backend="containernet", prefix="gdtbd", scale=2000)
    try:
        a, b = emu.addr.hosts[0], emu.addr.hosts[-1]
        out = emu.backend.run(emu.node(a.ns), ["ping", "-n", "-c", "1", "-W", "3", b.ip], check=False)
        assert " 0% packet loss" in out
    finally:
        down(emu)
    assert snapshot() == before

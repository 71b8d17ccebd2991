"""The real 3dc topology on the netns backend: reachability, RTT, throughput, clean teardown."""

from __future__ import annotations

import itertools

import pytest

from testbed.emu.build import down, up
from testbed.emu.check import iperf, ping
from testbed.emu.names import host_name
from testbed.spec.load import load_topology
from tests.conftest import ROOT
from tests.integration.conftest import assert_wan_rtt, snapshot, write_topology


@pytest.fixture(scope="module")
def three_dc():
    before = snapshot()
    topo = load_topology(ROOT / "topologies" / "3dc.yaml")
    emu = up(topo, prefix="gdtbt1", scale=2000)
    yield emu, before
    down(emu)


def test_every_host_reaches_every_other(three_dc):
    emu, _ = three_dc
    hosts = emu.addr.hosts
    assert len(hosts) == 6
    for a, b in itertools.permutations(hosts, 2):
        out = emu.backend.run(emu.node(a.ns), ["ping", "-n", "-c", "1", "-W", "3", b.ip], check=False)
        assert " 0% packet loss" in out, f"{host_name(a)} -> {host_name(b)}"


def test_wan_rtt_matches_configuration(three_dc):
    emu, _ = three_dc
    for link in emu.topo.links:
        a, b = link.between
        st = ping(emu, f"{a}-h0", emu.addr.host(f"{b}-h0").ip, 20)
        assert_wan_rtt(st, link.latency_ms, link.between)


def test_delay_method_is_reported(three_dc):
    emu, _ = three_dc
    assert emu.delay in ("netem", "nfqueue")
    assert emu.state()["delay"] == emu.delay


def test_teardown_leaves_nothing():
    before = snapshot()
    emu = up(load_topology(ROOT / "topologies" / "3dc.yaml"), prefix="gdtbt2", scale=2000)
    during = snapshot()
    assert len(during["netns"] - before["netns"]) == 3 + 6 + 3
    down(emu)
    assert snapshot() == before


def test_100mbit_link_with_delay_reaches_80_percent(tmp_path):
    topo = load_topology(write_topology(tmp_path / "t.yaml", gbps=0.1, latency=25))
    emu = up(topo, prefix="gdtbt3", scale=1)
    try:
        res = iperf(emu, "east-h0", "west-h0", 5201, 4, 4)
        assert res["received_mbps"] >= 80, res
    finally:
        down(emu)

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


def test_hosts_route_each_peer_dc_at_its_links_packet_size_with_the_window_open(three_dc):
    """Each host has a route per peer DC at the link's packet size (runtime/htb.py link_mtu: a packet lasts on the
    emulated link what a jumbo frame lasts at 200 Mbit/s) that opens a connection's congestion window to the link's
    window (or its bandwidth-delay product, if smaller; emu/build.py initial_windows), as the simulator's
    window-bound model has it from the start, and acknowledges every packet at once (emu/build.py peer_routes)."""
    import math

    from testbed.emu.build import LINUX_INITIAL_CWND
    from testbed.runtime.htb import link_mtu

    emu, _ = three_dc
    for h in emu.addr.hosts:
        dev = emu.backend.run(emu.node(h.ns), ["ip", "-d", "link", "show", "eth0"])
        assert "gso_max_segs 2 " in dev, dev  # no TSO/GSO packet above HTB's quantum (runtime/htb.py)
        routes = emu.backend.run(emu.node(h.ns), ["ip", "route", "show"])
        for link in emu.topo.links:
            if h.dc not in link.between:
                continue
            peer = next(d for d in link.between if d != h.dc)
            bdp = link.gbps * 1e9 / emu.scale / 8 * 2 * link.latency_ms / 1e3
            segments = max(LINUX_INITIAL_CWND, math.ceil(min(emu.window_bytes(h.dc, peer), bdp) / emu.mss(h.dc, peer)))
            line = next(ln for ln in routes.splitlines() if ln.startswith(emu.addr.lan_subnet[peer]))
            assert f"initcwnd {segments}" in line, (h.ns, routes)
            assert f"mtu lock {link_mtu(link.gbps * 1e9 / emu.scale)}" in line, (h.ns, routes)
            assert "quickack 1" in line, (h.ns, routes)  # no delayed ACK holding a window of a few segments


MSS_PROBE = """
import socket, sys, threading
srv = socket.create_server(("0.0.0.0", 7501)) if sys.argv[1] == "listen" else None
if srv:
    c, _ = srv.accept(); c.recv(1); print(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG))
else:
    import time
    for _ in range(100):
        try:
            c = socket.create_connection((sys.argv[2], 7501)); break
        except OSError:
            time.sleep(0.05)
    c.sendall(b"x"); print(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)); c.close()
"""


def test_connections_across_a_slow_link_carry_smaller_segments(tmp_path):
    """Both ends of a real TCP connection across a 50 Mbit/s WAN link send segments of the link's MSS (a quarter of
    a jumbo frame's: emu/build.py link_mss), and a connection inside a DC keeps the jumbo MSS."""
    import sys

    from testbed.emu.build import MSS

    before = snapshot()
    emu = up(load_topology(write_topology(tmp_path / "t.yaml", gbps=0.05, latency=2, hosts=2)), prefix="gdtbt4",
             scale=1)
    try:
        assert emu.mss("east", "west") == 9000 // 4 - 52
        for dst, want in (("west-h0", emu.mss("east", "west")), ("east-h1", MSS)):
            rx = emu.backend.popen(emu.host_node(dst), [sys.executable, "-c", MSS_PROBE, "listen"], stdout=-1,
                                   text=True)
            sent = emu.backend.run(emu.host_node("east-h0"),
                                   [sys.executable, "-c", MSS_PROBE, "connect", emu.addr.host(dst).ip], timeout=30)
            got = rx.communicate(timeout=30)[0]
            assert int(sent) == int(got) == want, (dst, sent, got, want)
    finally:
        down(emu)
    assert snapshot() == before


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


def test_dc_bridges_skip_netfilter(three_dc):
    """br_netfilter (built in here, loaded by dockerd elsewhere) is on in every new namespace: each DC gateway turns
    it off, so frames between a DC's hosts do not take an iptables pass (emu/backends/netns.py attach_lan)."""
    from testbed.emu.backends.netns import BRIDGE_NF, BRIDGE_NF_TABLES

    emu, _ = three_dc
    if not BRIDGE_NF.exists():
        pytest.skip("no br_netfilter on this kernel")
    for dc in (d.name for d in emu.topo.dcs):
        gw = emu.node(emu.addr.gateways[dc][0])
        for t in BRIDGE_NF_TABLES:
            out = emu.backend.run(gw, ["sysctl", "-n", f"net.bridge.bridge-nf-call-{t}"])
            assert out.strip() == "0", (dc, t)

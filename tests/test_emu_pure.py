"""Pure parts of the emulator: names, addresses, port blocks, parsers. No root needed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.emu.build import FOREIGN_SHARE, receive_buffer, window_notes
from testbed.emu.delayline import parse_specs
from testbed.emu.flowctl import port_blocks
from testbed.emu.measure import ping_stats
from testbed.emu.names import OURS_RE, address_plan, check_prefix, host_name
from testbed.emu.scale import auto_scale
from testbed.emu.shaping import htb_commands
from testbed.errors import SpecError
from testbed.runtime.htb import burst_bytes
from testbed.spec.load import load_topology
from tests.conftest import ROOT

TOPO = load_topology(ROOT / "topologies" / "3dc.yaml")


def test_address_plan_3dc():
    ap = address_plan(TOPO, "gdtb0")
    assert [host_name(h) for h in ap.hosts] == ["useast-h0", "useast-h1", "uscentral-h0", "uscentral-h1",
                                                "uswest-h0", "uswest-h1"]
    assert ap.host("uswest-h1").ip == "10.80.2.2" and ap.gateways["uswest"][1] == "10.80.2.254"
    w = ap.wan("uswest", "useast")
    assert (w.gw_a_ip, w.wan_a_ip, w.gw_b_ip, w.wan_b_ip) == ("10.81.2.1", "10.81.2.2", "10.81.2.5", "10.81.2.6")
    names = [h.ns for h in ap.hosts] + [g for g, _ in ap.gateways.values()] + [w.ns for w in ap.wans]
    assert len(set(names)) == len(names) and all(OURS_RE.match(n) for n in names)
    with pytest.raises(SpecError):
        ap.host("nowhere-h0")


@pytest.mark.parametrize("bad", ["gdtb", "tb0", "gdtb0-x", "gdtb12345", "GDTB0", "mininet"])
def test_prefix_must_be_ours(bad):
    with pytest.raises(SpecError):
        check_prefix(bad)


@given(st.integers(0, 0xFFFF), st.integers(0, 4000))
def test_port_blocks_cover_exactly(lo, span):
    hi = min(lo + span, 0xFFFF)
    covered = set()
    for value, mask in port_blocks(lo, hi):
        size = (~mask & 0xFFFF) + 1
        assert value & ~mask & 0xFFFF == 0  # aligned
        block = set(range(value, value + size))
        assert not covered & block
        covered |= block
    assert covered == set(range(lo, hi + 1))


def test_ping_stats():
    out = "64 bytes from 10.80.1.1: icmp_seq=1 ttl=62 time=28.6 ms\n" * 3 + "... time=31.2 ms\n"
    s = ping_stats(out)
    assert s["rtt_min_ms"] == 28.6 and s["rtt_p99_ms"] == 31.2 and s["samples"] == 4
    assert ping_stats("100% packet loss")["samples"] == 0


def test_delayline_specs():
    assert parse_specs(["0:25", "1:2.5"]) == {0: 0.025, 1: 0.0025}
    with pytest.raises(SystemExit):
        parse_specs(["x:1"])


def test_scale_and_window_notes():
    assert auto_scale(TOPO) == 2000
    notes = window_notes(TOPO, 2000)
    assert len(notes) == 3 and "below 64 KiB" in notes[0]
    assert window_notes(TOPO, 10) == []
    assert receive_buffer(65536) == int(65536 / FOREIGN_SHARE)


def test_htb_has_explicit_burst_and_leaf():
    cmds = htb_commands("west", 1e8, 0.05, None, 9000)
    assert any("burst" in c and str(burst_bytes(9000)) in c for c in cmds)
    leaves = [c for c in cmds if c[:3] == ["tc", "qdisc", "add"] and "parent" in c]
    assert [c[c.index("parent") + 1] for c in leaves] == ["1:10", "1:30"]  # the default class and the ACK class
    assert all(c[-3:-1] == ["bfifo", "limit"] for c in leaves)
    netem = [c for c in htb_commands("west", 1e8, 0.05, 25, 9000) if "netem" in c]
    assert len(netem) == 2 and all(c[9:12] == ["netem", "delay", "25ms"] for c in netem)


def test_tcp_control_packets_go_to_the_ack_class_before_any_flow_class():
    """Pure ACKs (IP packets under 128 bytes) are matched at filter priority 1, before the flow classes' 10, into a
    class of HTB's first priority: they do not queue behind the other direction's data."""
    from testbed.emu.flowctl import FILTER_PRIO
    from testbed.emu.shaping import ACK_FILTER_PRIO, ACK_MAX_IP_BYTES, ACK_MINOR

    cmds = htb_commands("west", 1e8, 0.05, None, 9000)
    flt = next(c for c in cmds if c[:3] == ["tc", "filter", "add"])
    assert int(flt[flt.index("prio") + 1]) == ACK_FILTER_PRIO < FILTER_PRIO
    assert flt[flt.index("protocol", flt.index("match")) + 1] == "6"  # TCP
    assert int(flt[flt.index("u16") + 2], 16) == 0x10000 - ACK_MAX_IP_BYTES and flt[-1] == f"1:{ACK_MINOR:x}"
    cls = next(c for c in cmds if f"1:{ACK_MINOR:x}" in c and c[1] == "class")
    assert cls[cls.index("prio") + 1] == "0" and cls[cls.index("ceil") + 1] == cmds[1][cmds[1].index("ceil") + 1]


@pytest.mark.parametrize("mtu", [1500, 4000, 9000])
def test_the_ack_class_is_guaranteed_the_other_directions_acknowledgements(mtu):
    """The link's default class is guaranteed the whole link, so the ACK class cannot borrow while the other
    direction's data fills it: its own guarantee (on the wire) carries one control packet of the largest size the
    filter takes for every full segment the link's rate delivers, more than a 1 % trickle in 1,500-byte packets."""
    from testbed.emu.shaping import ACK_MAX_IP_BYTES, ACK_MINOR
    from testbed.runtime.htb import trickle_bps, wire_bps

    link_bps = 13.2e6
    cmds = htb_commands("west", link_bps, 0.04, None, mtu)
    cls = next(c for c in cmds if f"1:{ACK_MINOR:x}" in c and c[1] == "class")
    guaranteed_wire_bps = int(cls[cls.index("rate") + 1].removesuffix("bit"))
    segments_s = link_bps / 8 / (mtu - 52)
    assert guaranteed_wire_bps >= int(segments_s * (ACK_MAX_IP_BYTES + 14) * 8) - 1
    if mtu == 1500:
        assert guaranteed_wire_bps > 2 * wire_bps(trickle_bps(link_bps), mtu)


@pytest.mark.parametrize("delay", ["netem", "nfqueue"])
def test_every_flow_class_leaf_delays_where_the_run_delays_with_netem(delay):
    """A packet HTB files under a replica's, the sidecar's or the KV class never passes the default class's
    leaf: with netem, each class's own leaf carries the link's delay (with the delay line, HTB sees packets
    already delayed, so a bfifo)."""
    from testbed.emu.backends.base import Node
    from testbed.emu.backends.netns import NetnsBackend
    from testbed.emu.build import Emulation
    from testbed.emu.flowctl import FlowControl
    from testbed.emu.shaping import leaf_command

    addr = address_plan(TOPO, "gdtbz")
    backend = NetnsBackend("gdtbz")
    w = addr.wan("useast", "uswest")
    backend.nodes[w.ns] = Node(w.ns, "wan", ns=w.ns)  # never created: leaf() only builds the command
    emu = Emulation("gdtbz", TOPO, backend, addr, 2000.0, delay)
    latency = TOPO.link("useast", "uswest").latency_ms
    cmd = FlowControl(emu, "useast", "uswest", "uswest").leaf(0x101, 1e8)
    assert cmd[:9] == ["tc", "qdisc", "add", "dev", "uswest", "parent", "1:101", "handle", "101:"]
    if delay == "netem":
        assert cmd[9:12] == ["netem", "delay", f"{latency:g}ms"]
        link = htb_commands("uswest", 1e8, 2 * latency / 1e3, latency, 9000)
        assert all(c[9:12] == cmd[9:12] for c in link if c[1] == "qdisc" and "parent" in c)  # as the default's
    else:
        assert cmd[9] == "bfifo"
    # a WAN that changes re-delays a leaf in place, under the same handle
    change = leaf_command("uswest", 0x101, 1e8, 0.2, 100.0, "change")
    assert change[2] == "change" and change[6:11] == ["1:101", "handle", "101:", "netem", "delay"]
    assert leaf_command("uswest", 0x10, 1e8, 0.0, 0.0)[9:12] == ["netem", "delay", "0ms"]  # netem even at 0 ms

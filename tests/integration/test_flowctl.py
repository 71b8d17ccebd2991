"""Per-flow HTB classes on a WAN egress, changed at runtime through netlink."""

from __future__ import annotations

from testbed.emu.build import down, up
from testbed.emu.check import iperf
from testbed.emu.flowctl import FlowControl
from testbed.spec.load import load_topology
from tests.integration.conftest import write_topology


def test_flow_class_limits_and_changes_at_runtime(tmp_path):
    emu = up(load_topology(write_topology(tmp_path / "t.yaml", gbps=0.2, latency=2)), prefix="gdtbf", scale=1)
    try:
        fc = FlowControl(emu, "east", "west", "west")
        fc.add_class(0x20, 20e6, ports=(5300, 5315))
        fc.add_class(0x21, 8e3, mark=7)  # nothing is marked: must not catch other traffic
        slow = iperf(emu, "east-h0", "west-h0", 5301, 2, 2)["received_mbps"]
        free = iperf(emu, "east-h0", "west-h0", 5201, 2, 2)["received_mbps"]  # default class: the whole link
        took = fc.set_rate(0x20, 60e6)
        fast = iperf(emu, "east-h0", "west-h0", 5302, 2, 2)["received_mbps"]
        counters = fc.class_bytes()
        fc.close()
    finally:
        down(emu)
    assert slow <= 20 * 1.3, slow
    assert free > 2 * slow
    assert 1.5 * slow < fast <= 60 * 1.3, (slow, fast)
    assert took > 0
    assert counters[0x20] > 0 and counters[0x21] == 0


def test_marked_flow_goes_to_its_class(tmp_path):
    emu = up(load_topology(write_topology(tmp_path / "t.yaml", gbps=0.2, latency=2)), prefix="gdtbg", scale=1)
    try:
        fc = FlowControl(emu, "east", "west", "west")
        fc.add_class(0x22, 10e6, mark=9)
        wan = emu.node(emu.addr.wan("east", "west").ns)
        emu.backend.run(wan, ["iptables", "-t", "mangle", "-A", "PREROUTING", "-p", "tcp", "--dport", "5401", "-j",
                              "MARK", "--set-mark", "9"])
        marked = iperf(emu, "east-h0", "west-h0", 5401, 2, 2)["received_mbps"]
        counters = fc.class_bytes()
        fc.close()
    finally:
        down(emu)
    assert marked <= 10 * 1.3 and counters[0x22] > 0

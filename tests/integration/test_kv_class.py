"""BubbleTea's KV caches in their own HTB class on each WAN hop (emu/train.py classify_kv): traffic to the decode
port is counted in that class; on a link with Atlas's turns it yields to the replica in turn and to an idle one, on
a fair-shared link it shares."""

from __future__ import annotations

import threading

from testbed.bubbletea.emulated import DECODE_PORT
from testbed.emu.build import down, up
from testbed.emu.check import iperf
from testbed.emu.flowctl import FlowControl
from testbed.emu.train import KV_MINOR, add_kv_classes, remove_kv_classes
from testbed.runtime.htb import IDLE_PRIO, KV_PRIO
from testbed.spec.load import load_topology
from tests.integration.conftest import write_topology

LINK_BPS = 100e6
REPLICA_PORT = 7001  # a training pipe's port (testbed/plan/lower.py BASE_PORT + 1)


def together(emu, seconds: float) -> dict[int, float]:
    """Received Mbit/s of one bulk flow to the decode port and one to a replica's port, run at once."""
    out: dict[int, float] = {}

    def one(port: int) -> None:
        out[port] = iperf(emu, "east-h0", "west-h0", port, seconds, 2)["received_mbps"]

    threads = [threading.Thread(target=one, args=(p,)) for p in (DECODE_PORT, REPLICA_PORT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_kv_caches_get_their_own_lowest_priority_class(tmp_path):
    emu = up(load_topology(write_topology(tmp_path / "t.yaml", gbps=LINK_BPS / 1e9, latency=2)), prefix="gdtbk4",
             scale=1)
    kv_hops: dict = {}
    try:
        add_kv_classes(emu, kv_hops, DECODE_PORT, {frozenset(("east", "west"))})  # a link with Atlas's turns
        wan = emu.node(emu.addr.wan("east", "west").ns)
        shown = emu.backend.run(wan, ["tc", "class", "show", "dev", "west"])
        fc = FlowControl(emu, "east", "west", "west")
        # a replica class as the Atlas sidecar sets the one in turn: the link guaranteed, priority 0
        fc.add_class(0x100, LINK_BPS, ceil_bps=LINK_BPS, prio=0, ports=(REPLICA_PORT, REPLICA_PORT))
        before = fc.class_bytes()
        turn = together(emu, 2.0)
        after_turn = fc.class_bytes()
        # the same replica before the sidecar has ranked it: a trickle, the idle replicas' priority
        fc.set_rate(0x100, LINK_BPS / 100, LINK_BPS, IDLE_PRIO)
        idle = together(emu, 2.0)
        # a fair-shared link: the KV class at the replicas' priority
        remove_kv_classes(emu, kv_hops)
        kv_hops.clear()
        add_kv_classes(emu, kv_hops, DECODE_PORT, set())
        fc.add_filter(0x100, ports=(REPLICA_PORT, REPLICA_PORT))  # the removal took every filter of ours
        shown_fair = emu.backend.run(wan, ["tc", "class", "show", "dev", "west"])
        fair = together(emu, 2.0)
        fc.close()
    finally:
        remove_kv_classes(emu, kv_hops)
        down(emu)
    kv_line = next(ln for ln in shown.splitlines() if f"class htb 1:{KV_MINOR:x} " in ln)
    assert f"prio {KV_PRIO}" in kv_line, shown
    assert f"prio {IDLE_PRIO}" in next(ln for ln in shown_fair.splitlines() if f"class htb 1:{KV_MINOR:x} " in ln)
    assert set(kv_hops) == {("east", "west")} and set(kv_hops[("east", "west")]) == {"east", "west"}
    kv_bytes = after_turn[KV_MINOR] - before.get(KV_MINOR, 0)
    assert kv_bytes > 100_000, after_turn  # the decode port's bytes are classified into the KV class
    assert after_turn[0x10] - before.get(0x10, 0) < kv_bytes  # not into the link's default class
    assert turn[DECODE_PORT] < 0.5 * turn[REPLICA_PORT], turn  # Atlas: the replica in turn first
    assert idle[DECODE_PORT] < 0.5 * idle[REPLICA_PORT], idle  # and an idle replica too (KV_RANK)
    assert fair[DECODE_PORT] > 0.4 * fair[REPLICA_PORT], fair  # fair sharing: one class among others

"""A WAN link busy in both directions carries each at its rate: each direction's acknowledgements leave on the
other's egress, whose default class is guaranteed the whole link, so the ACK class gets only its own guarantee
there (emu/shaping.py ack_bps). In the 1,500-byte packets of a slow emulated link the acknowledgements take 2-5 %
of the data's rate; with a 1 % guarantee one direction ran about 16 % under the link's rate."""

from __future__ import annotations

import json
import sys

from testbed.emu.build import down, up
from testbed.spec.load import load_topology
from tests.integration.conftest import snapshot, write_topology
from tests.integration.test_round_robin_bytes import RECEIVER, SENDER, _bytes_between

LINK_BPS = 13.2e6  # 1,500-byte packets (net/wire.py link_mtu)
SECONDS = 4.0
PORTS = (7411, 7412, 7413, 7414, 7415, 7416)  # six connections each way, as a ring's groups across a link


def test_a_link_busy_both_ways_carries_each_direction_at_its_rate(tmp_path):
    before = snapshot()
    topo = write_topology(tmp_path / "t.yaml", gbps=LINK_BPS / 1e9, latency=20, window_mb=0.075)
    emu = up(load_topology(topo), prefix="gdtbw2", scale=1)
    try:
        hosts = {"east": emu.host_node("east-h0"), "west": emu.host_node("west-h0")}
        rx = {dc: emu.backend.popen(node, [sys.executable, "-c", RECEIVER, *map(str, PORTS)], stdout=-1, text=True)
              for dc, node in hosts.items()}
        tx = [emu.backend.popen(hosts[src], [sys.executable, "-c", SENDER, emu.addr.host(f"{dst}-h0").ip,
                                             str(SECONDS), *(f"{p}:0" for p in PORTS)])
              for src, dst in (("east", "west"), ("west", "east"))]
        for p in tx:
            p.wait(timeout=60)
        marks = {dc: {int(k): v for k, v in json.loads(p.communicate(timeout=60)[0]).items()} for dc, p in rx.items()}
    finally:
        down(emu)
    every = [m for by_port in marks.values() for m in by_port.values()]
    start, end = max(m[0][0] for m in every), min(m[-1][0] for m in every)
    t0, t1 = start + 0.25 * (end - start), start + 0.75 * (end - start)  # both directions backlogged
    for dc, by_port in marks.items():
        bps = sum(_bytes_between(m, t0, t1) for m in by_port.values()) * 8 / (t1 - t0)
        assert bps > 0.93 * LINK_BPS, (dc, bps / LINK_BPS)
    assert snapshot() == before

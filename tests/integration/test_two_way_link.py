"""A WAN link busy in both directions carries each at its rate: each direction's acknowledgements leave on the
other's egress, whose default class is guaranteed the whole link, so the ACK class gets only its own guarantee
there (emu/shaping.py ack_bps). In the 1,500-byte packets of a slow emulated link the acknowledgements take 2-5 %
of the data's rate; with a 1 % guarantee one direction's messages took 12-16 % longer than their fluid time.
Six connections each way with the workers' striped transport (bench/tcp_probe.py), as a ring's groups across a
link exchange at once."""

from __future__ import annotations

import json
import sys

from tests.integration.conftest import ROOT, snapshot_of

sys.path.insert(0, str(ROOT / "bench"))
from tcp_fidelity import Link  # noqa: E402

from testbed.net.scale import link_mss  # noqa: E402

PREFIX = "gdtbw2"
RATE_MBPS, LATENCY_MS = 13.24, 19.41  # 1,500-byte packets (net/wire.py link_mtu)
CONNECTIONS, MESSAGES = 6, 5


def test_a_link_busy_both_ways_carries_each_direction_at_its_rate():
    before = snapshot_of(PREFIX)
    window = 54 * link_mss(RATE_MBPS * 1e6)  # above the bandwidth-delay product: link-bound
    with Link(PREFIX, RATE_MBPS, LATENCY_MS, window) as link:
        nbytes = 1_542_000  # about a second of the link per message, every connection a share
        fluid_s = nbytes / link.C + link.l
        ports = {"west-h0": 6311, "east-h0": 6312}
        servers = {h: link.spawn(h, "pipe-server", p, CONNECTIONS, MESSAGES, window) for h, p in ports.items()}
        assert all(s.stdout.readline().strip() == "ready" for s in servers.values())
        clients = [link.spawn(src, "pipe-client", link.emu.addr.host(dst).ip, ports[dst], CONNECTIONS, nbytes,
                              MESSAGES, 2 * fluid_s + 0.3)
                   for src, dst in (("east-h0", "west-h0"), ("west-h0", "east-h0"))]
        took = {h: [t1 - t0 for t0, t1 in json.loads(s.stdout.readline())][1:] for h, s in servers.items()}
        for p in (*clients, *servers.values()):
            p.wait(timeout=60)
    for host, ds in took.items():  # the first message warms the connections up
        assert sorted(ds)[len(ds) // 2] < 1.05 * fluid_s, (host, ds, fluid_s)
    assert snapshot_of(PREFIX) == before

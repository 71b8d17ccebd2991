"""How much shaped, delayed WAN traffic this machine carries now: `testbed launch --scale auto`'s probe (an
emulated run's CPU and timer probe is testbed/emu/headroom.py; the two are to become one).

The probe builds a two-DC WAN under the caller's prefix with one link far faster than any machine shapes
(PROBE_GBPS at k = 1, a 5 ms one-way delay through the same delay method a launch uses), sends bulk TCP
over PROBE_CONNECTIONS connections for PROBE_S seconds (the training workers' sender and reader,
`testbed.emu.check.bulk`), and tears the WAN down. What arrives is what the HTB, the delay line and the
hosts' TCP stacks sustain together on this machine under its current load: the ceiling of the emulated
WAN's aggregate rate. Kept apart from the choice of k (testbed.emu.scale.choose_scale), which is pure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PROBE_GBPS = 20.0  # far above what a veth, HTB and a delay line carry on one machine
PROBE_LATENCY_MS = 5.0
PROBE_WINDOW_MB = 4  # 8 x 4 MiB per 10 ms round trip: windows never limit the probe
PROBE_CONNECTIONS = 8
PROBE_WARMUP_S = 0.5
PROBE_S = 1.5
PROBE_PORT = 5299


@dataclass(frozen=True)
class Headroom:
    """The measured ceiling of shaped, delayed traffic, with what it was measured on."""

    ceiling_bps: float
    cpus: int
    delay: str  # the delay method probed: netem | nfqueue
    load_1min: float  # the machine's load average when probed

    def describe(self) -> str:
        return (f"this machine carries {self.ceiling_bps / 1e6:,.0f} Mbit/s of shaped, {self.delay}-delayed TCP "
                f"({self.cpus} CPUs, load {self.load_1min:.2f})")


def probe_topology():
    from testbed.spec.topology import Topology

    dc = {"gpu": "H100", "gpus": 1, "gpus_per_node": 1, "intra_gbps": 50, "hosts": 1}
    return Topology.model_validate({
        "name": "headroom-probe", "tcp_window_mb": PROBE_WINDOW_MB,
        "dcs": [{"name": "pa", **dc}, {"name": "pb", **dc}],
        "links": [{"between": ["pa", "pb"], "gbps": PROBE_GBPS, "latency_ms": PROBE_LATENCY_MS}]})


def probe(prefix: str, delay: str = "auto") -> Headroom:
    """Build the probe WAN under `prefix` (which must be free), measure, tear it down (whatever happens)."""
    from testbed.emu.build import down, up
    from testbed.emu.check import bulk

    emu = up(probe_topology(), prefix=prefix, scale=1.0, delay=delay)
    try:
        res = bulk(emu, "pa-h0", "pb-h0", PROBE_PORT, PROBE_S, PROBE_CONNECTIONS, emu.window_bytes("pa", "pb"),
                   PROBE_WARMUP_S)
        method = emu.delay
    finally:
        down(emu)
    return Headroom(res["received_mbps"] * 1e6, os.cpu_count() or 1, method, os.getloadavg()[0])

"""What the packet capture costs: TCP throughput across one emulated WAN link with and without the
capture running (alternating, `--rounds` times each), the capture's CPU share, and what it saw.

Needs root. Run: sudo .venv/bin/python bench/capture_overhead.py [--mbps 200] [--seconds 4] [--rounds 3]
Throughput is 4 parallel streams with a 16 MiB window (never window-bound), so it measures the link.
This machine is shared: rounds alternate so a load change hits both sides alike.
"""

from __future__ import annotations

import argparse
import statistics

from testbed.emu.build import down, up
from testbed.emu.capture import Capture
from testbed.emu.check import iperf
from testbed.spec.topology import Topology


def topology(mbps: float, latency_ms: float) -> Topology:
    return Topology.model_validate({
        "name": "capture-overhead", "tcp_window_mb": 16,
        "dcs": [{"name": "east", "gpus": 8, "hosts": 1}, {"name": "west", "gpus": 8, "hosts": 1}],
        "links": [{"between": ["east", "west"], "gbps": mbps / 1e3, "latency_ms": latency_ms}],
    })


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mbps", type=float, default=200)
    ap.add_argument("--latency-ms", type=float, default=10)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefix", default="gdtbl9")
    a = ap.parse_args()
    emu = up(topology(a.mbps, a.latency_ms), prefix=a.prefix, scale=1)
    plain, captured, notes = [], [], []
    try:
        for _ in range(a.rounds):
            plain.append(iperf(emu, "east-h0", "west-h0", 5201, a.seconds, 4)["received_mbps"])
            with Capture(emu, seconds=a.seconds + 30) as cap:
                captured.append(iperf(emu, "east-h0", "west-h0", 5201, a.seconds, 4)["received_mbps"])
            notes.append(cap.result.summary())
    finally:
        down(emu)
    p, c = statistics.median(plain), statistics.median(captured)
    print(f"link {a.mbps:g} Mbit/s, {2 * a.latency_ms:g} ms RTT, 4 streams, {a.seconds:g} s x {a.rounds} rounds")
    print(f"without capture: {' '.join(f'{x:.1f}' for x in plain)} Mbit/s (median {p:.1f})")
    print(f"with capture:    {' '.join(f'{x:.1f}' for x in captured)} Mbit/s (median {c:.1f})")
    print(f"throughput with / without capture: {c / p:.3f}")
    for n in notes:
        print(f"  {n}")


if __name__ == "__main__":
    main()

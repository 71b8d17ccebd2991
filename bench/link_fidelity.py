"""Emulated WAN fidelity: configured vs measured RTT and TCP throughput for 10, 100 and 200 Mbit/s
at 5, 25 and 50 ms one-way delay, and the delay line's CPU share while the link is full.

Needs root. Run: sudo .venv/bin/python bench/link_fidelity.py [--seconds 4] [--prefix gdtbN]
Throughput is 4 parallel streams with a 16 MiB window (never window-bound), so it measures the link.
"""

from __future__ import annotations

import argparse
import json
import time

from testbed.emu import state
from testbed.emu.build import down, up
from testbed.emu.check import iperf, ping
from testbed.spec.topology import Topology


def topology(mbps: float, latency_ms: float) -> Topology:
    return Topology.model_validate({
        "name": "fidelity", "tcp_window_mb": 16,
        "dcs": [{"name": "east", "gpus": 8, "hosts": 1}, {"name": "west", "gpus": 8, "hosts": 1}],
        "links": [{"between": ["east", "west"], "gbps": mbps / 1e3, "latency_ms": latency_ms}],
    })


def delayline_cpu(prefix: str) -> tuple[float, float]:
    f = state.STATE_DIR / prefix / f"{prefix}-wan-east-west.delay.json"
    if not f.exists():
        return 0.0, 0.0
    s = json.loads(f.read_text())
    return s["cpu_s"], s["wall"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--prefix", default=None, help="emulation prefix (default: the first free gdtb<N>)")
    args = ap.parse_args()
    print(f"{'Mbit/s':>7}{'one-way ms':>11}{'RTT cfg':>9}{'RTT min':>9}{'RTT avg':>9}{'RTT p99':>9}"
          f"{'measured':>10}{'ratio':>7}{'delay CPU':>11}  method", flush=True)
    for mbps in (10, 100, 200):
        for lat in (5, 25, 50):
            emu = up(topology(mbps, lat), prefix=args.prefix, scale=1)
            try:
                rtt = ping(emu, "east-h0", emu.addr.host("west-h0").ip, 40)
                c0, w0 = delayline_cpu(emu.prefix)
                tput = iperf(emu, "east-h0", "west-h0", 5201, args.seconds, 4)["received_mbps"]
                time.sleep(1.1)  # the delay line writes its counters once a second
                c1, w1 = delayline_cpu(emu.prefix)
                cpu = (c1 - c0) / (w1 - w0) if w1 > w0 else 0.0
            finally:
                down(emu)
            print(f"{mbps:>7}{lat:>11}{2 * lat:>9.1f}{rtt['rtt_min_ms']:>9.2f}{rtt['rtt_avg_ms']:>9.2f}"
                  f"{rtt['rtt_p99_ms']:>9.2f}{tput:>10.1f}{tput / mbps:>7.2f}{cpu:>10.0%}  {emu.delay}", flush=True)


if __name__ == "__main__":
    main()

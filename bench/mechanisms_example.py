"""The README's worked example: one 50 MB activation per replica over one WAN link, 36 replicas.

Prints when each replica's activation has arrived under each mechanism, from the simulator.
Run: .venv/bin/python bench/mechanisms_example.py
"""

from __future__ import annotations

from testbed.costs.tcp import connections_for
from testbed.plan.synthetic import make_plan
from testbed.sim.executor import simulate

C = 400e9 / 8  # 400 Gbit/s in bytes/s
LAT = 0.035  # one way
W = 6 * 2**20
A = 2048 * 12288 * 2  # GPT-3 activation of one 2048-token microbatch, bf16
DP = 36


def arrivals(conns: int, temporal: bool) -> list[float]:
    plan = make_plan(pp=2, dp=DP, m=1, f=0.0, b=0.0, dcs=["a", "b"], act_bytes=A, capacity=C, latency=LAT,
                     window=W, connections=conns, temporal=temporal)
    tl, _ = simulate(plan)
    return sorted(iv.end_s for iv in tl.intervals if iv.kind == "recv" and iv.stage == 1)


def main() -> None:
    n = connections_for(C, W, 2 * LAT, 128)
    print(f"link 400 Gbit/s, one-way {LAT * 1e3:.0f} ms, window {W / 2**20:.0f} MiB, activation {A / 1e6:.1f} MB, "
          f"{DP} replicas; one connection carries {W / (2 * LAT) / 1e6:.0f} MB/s; multi-TCP uses n={n}")
    print(f"{'mechanism':<34}{'first arrival':>14}{'median':>10}{'last':>10}  (ms)")
    for name, conns, temporal in [("pp-1tcp: 1 connection, fair share", 1, False),
                                  ("+mtcp: n connections, fair share", n, False),
                                  ("pp-1tcp+temporal: 1 conn, turns", 1, True),
                                  ("atlas: n connections, turns", n, True)]:
        a = arrivals(conns, temporal)
        print(f"{name:<34}{a[0] * 1e3:>14.1f}{a[len(a) // 2] * 1e3:>10.1f}{a[-1] * 1e3:>10.1f}")


if __name__ == "__main__":
    main()

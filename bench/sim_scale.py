"""Simulator scale benchmark: one iteration of a 3,456-GPU job over 3 DCs, then a 20-point sweep.

Prints GPUs, events, wall seconds and events/s. A benchmark, not a test: numbers vary by machine.
Run: .venv/bin/python bench/sim_scale.py
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from testbed.plan.build import build_plan
from testbed.sim.executor import simulate
from testbed.sim.run import run_experiment
from testbed.spec.load import load_experiment

EXP = Path(__file__).resolve().parent.parent / "experiments" / "paper-3dc.yaml"


def main() -> None:
    exp, _ = load_experiment(EXP, sets=["schedulers=[atlas]", "topology.links.*.latency_ms=20"])[0]
    print(f"{'scheduler':<16}{'GPUs':>6}{'groups':>8}{'events':>9}{'wall_s':>9}{'events/s':>11}{'iteration_s':>13}")
    for sched in ("pp-wan", "atlas", "dp-wan"):
        plan = build_plan(exp, sched)
        t0 = time.perf_counter()
        tl, events = simulate(plan)
        wall = time.perf_counter() - t0
        print(f"{sched:<16}{plan.gpus:>6}{plan.pp * plan.dp:>8}{events:>9}{wall:>9.2f}{events / wall:>11.0f}"
              f"{tl.iteration_s[0]:>13.3f}")
    lat = ",".join(str(5 + 3.5 * i) for i in range(20))
    points = load_experiment(EXP, sets=["schedulers=[atlas]", "timeline=none"],
                             sweeps=[f"topology.links.*.latency_ms={lat}"])
    jobs = os.cpu_count() or 1
    t0 = time.perf_counter()
    res = run_experiment(points, jobs=jobs)
    wall = time.perf_counter() - t0
    print(f"sweep: {len(points)} points x 1 scheduler (+ lower bound each) on {jobs} processes: {wall:.1f} s "
          f"({wall / len(res):.2f} s per point)")


if __name__ == "__main__":
    main()

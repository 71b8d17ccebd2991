"""Simulator scale benchmark: one iteration of Llama-3 405B (tp 8, pp 16, 4 DCs,
experiments/frontier-4dc.yaml) from 384 to 110,592 GPUs, per scheduler.

For each size it prints the GPUs, the replicas the simulator runs (symmetric replicas are simulated once),
the events its event loop handled, the timeline's intervals, and the seconds of
- `sim`: the simulation alone (testbed/sim/executor.py simulate);
- `run`: what `testbed sim` does for one scheduler at one point except writing files: plan, simulation,
  lower bound, summary metrics, and the bubbles and timeline of the `timeline_replicas` written.
Seconds are CPU seconds of this process (time.process_time: one core, what the simulator costs) with the
wall-clock seconds next to them (larger when the machine is shared). Then the growth from the smallest to
the largest size, and pp-wan's and dp-wan's time over atlas's at the largest.

A benchmark, not a test: numbers vary by machine and load.
Run: .venv/bin/python bench/sim_scale.py [--dp 3,27,108,432,864] [--schedulers atlas,pp-wan,dp-wan]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from testbed.plan.build import build_plan
from testbed.runs.simulated import run_point
from testbed.sim.executor import Simulation, simulate
from testbed.spec.load import load_experiment

EXP = Path(__file__).resolve().parent.parent / "experiments" / "frontier-4dc.yaml"
MICROBATCHES = 16  # per replica: global batch = 16 x dp


def sized(dp: int, scheduler: str):
    """The frontier spec at dp replicas: every DC holds a quarter of them (whole pipelines for dp-wan)."""
    per_dc = 128 * -(-dp // 4)  # tp x pp = 128 GPUs per replica
    sets = [f"workload.dp={dp}", f"workload.global_batch={MICROBATCHES * dp}", f"topology.dcs.*.gpus={per_dc}",
            f"schedulers=[{scheduler}]", "timeline=all"]
    return load_experiment(EXP, sets=sets)[0][0]


def timed(fn):
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dp", default="3,27,108,432,864", help="replica counts (GPUs = 128 x dp)")
    ap.add_argument("--schedulers", default="atlas,pp-wan,dp-wan")
    args = ap.parse_args()
    dps = [int(x) for x in args.dp.split(",")]
    scheds = args.schedulers.split(",")
    print(f"{EXP.name}: llama3-405b, tp 8, pp 16, {MICROBATCHES} microbatches per replica, 4 DCs; "
          "seconds are CPU (one core) / wall")
    print(f"{'scheduler':<10}{'GPUs':>9}{'simulated':>10}{'events':>9}{'intervals':>11}{'sim_s':>14}{'run_s':>14}"
          f"{'iteration_s':>13}")
    res: dict[tuple[str, int], float] = {}
    for sched in scheds:
        for dp in dps:
            exp = sized(dp, sched)
            plan = build_plan(exp, sched)
            sim = Simulation(plan)
            n_sim = len(sim.reps)
            del sim
            (tl, events), sim_cpu, sim_wall = timed(lambda plan=plan: simulate(plan))
            intervals = len(tl._raw[2]) if tl._raw else len(tl.rep_intervals())
            del tl
            results, run_cpu, run_wall = timed(lambda exp=exp: run_point(exp, 0, {}, keep_timeline=True))
            row = results[0].summary
            res[(sched, dp)] = run_cpu
            print(f"{sched:<10}{plan.gpus:>9,}{n_sim:>10}{events:>9,}{intervals:>11,}"
                  f"{sim_cpu:>8.2f} /{sim_wall:>5.2f}{run_cpu:>8.2f} /{run_wall:>5.2f}{row['iteration_s']:>13.3f}")
    lo, hi = dps[0], dps[-1]
    print(f"growth {128 * lo:,} -> {128 * hi:,} GPUs (x{hi / lo:.0f}), run CPU seconds: "
          + ", ".join(f"{s} x{res[(s, hi)] / res[(s, lo)]:.0f}" for s in scheds))
    if "atlas" in scheds:
        print(f"at {128 * hi:,} GPUs, run CPU seconds over atlas's: "
              + ", ".join(f"{s} {res[(s, hi)] / res[('atlas', hi)]:.2f}x" for s in scheds if s != "atlas"))


if __name__ == "__main__":
    main()

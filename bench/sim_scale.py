"""Simulator scale benchmark: one iteration of Llama-3 405B (tp 8, pp 16, 4 DCs,
experiments/frontier-4dc.yaml) from 384 to 1,048,576 GPUs, per scheduler.

For each size it prints the GPUs, the replicas the simulator runs (symmetric replicas are simulated once; past
110,592 GPUs replicas taking turns in blocks, testbed/sim/aggregate.py), the events its event loop handled, the
timeline's intervals, the peak resident memory of the process that ran the point, and the seconds of
- `sim`: the simulation alone (testbed/sim/executor.py simulate);
- `run`: what `testbed sim` does for one scheduler at one point except writing files: plan, simulation,
  lower bound, summary metrics, and the bubbles and timeline of the `timeline_replicas` written.
Seconds are CPU seconds of this process (time.process_time: one core, what the simulator costs) with the
wall-clock seconds next to them (larger when the machine is shared). Then the growth from the smallest to
the largest size, and pp-wan's and dp-wan's time over atlas's at the largest.

A benchmark, not a test: numbers vary by machine and load.
Each point runs in a child process of its own, so its peak memory is its own.
Run: .venv/bin/python bench/sim_scale.py [--dp 3,27,108,432,864,8192] [--schedulers atlas,pp-wan,dp-wan,diloco]
"""

from __future__ import annotations

import argparse
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from testbed.runs.simulated import run_point
from testbed.sim.choose import build_plan
from testbed.sim.executor import replica_classes
from testbed.sim.period import simulate
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


def point(dp: int, sched: str) -> dict:
    """One (size, scheduler): the simulation alone, then the whole run, in this (child) process."""
    exp = sized(dp, sched)
    plan = build_plan(exp, sched)
    n_sim = len(replica_classes(plan))
    (tl, events), sim_cpu, sim_wall = timed(lambda: simulate(plan))
    intervals = len(tl._raw[2]) if tl._raw else len(tl.rep_intervals())
    del tl
    results, run_cpu, run_wall = timed(lambda: run_point(exp, 0, {}, keep_timeline=True))
    return {"gpus": plan.gpus, "n_sim": n_sim, "events": events, "intervals": intervals, "sim_cpu": sim_cpu,
            "sim_wall": sim_wall, "run_cpu": run_cpu, "run_wall": run_wall,
            "iteration_s": results[0].summary["iteration_s"],
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dp", default="3,27,108,432,864,8192", help="replica counts (GPUs = 128 x dp)")
    ap.add_argument("--schedulers", default="atlas,pp-wan,dp-wan,diloco")
    args = ap.parse_args()
    dps = [int(x) for x in args.dp.split(",")]
    scheds = args.schedulers.split(",")
    print(f"{EXP.name}: llama3-405b, tp 8, pp 16, {MICROBATCHES} microbatches per replica, 4 DCs; "
          "seconds are CPU (one core) / wall; peak_mb: the point's peak resident memory")
    print(f"{'scheduler':<10}{'GPUs':>11}{'simulated':>10}{'events':>10}{'intervals':>11}{'sim_s':>15}{'run_s':>15}"
          f"{'peak_mb':>9}{'iteration_s':>13}")
    res: dict[tuple[str, int], float] = {}
    for sched in scheds:
        for dp in dps:
            with ProcessPoolExecutor(1, mp_context=get_context("fork")) as pool:
                x = pool.submit(point, dp, sched).result()
            res[(sched, dp)] = x["run_cpu"]
            print(f"{sched:<10}{x['gpus']:>11,}{x['n_sim']:>10}{x['events']:>10,}{x['intervals']:>11,}"
                  f"{x['sim_cpu']:>8.2f} /{x['sim_wall']:>6.2f}{x['run_cpu']:>8.2f} /{x['run_wall']:>6.2f}"
                  f"{x['peak_mb']:>9,.0f}{x['iteration_s']:>13.3f}", flush=True)
    lo, hi = dps[0], dps[-1]
    print(f"growth {128 * lo:,} -> {128 * hi:,} GPUs (x{hi / lo:.0f}), run CPU seconds: "
          + ", ".join(f"{s} x{res[(s, hi)] / res[(s, lo)]:.0f}" for s in scheds))
    if "atlas" in scheds:
        print(f"at {128 * hi:,} GPUs, run CPU seconds over atlas's: "
              + ", ".join(f"{s} {res[(s, hi)] / res[('atlas', hi)]:.2f}x" for s in scheds if s != "atlas"))


if __name__ == "__main__":
    main()

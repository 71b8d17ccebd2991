"""Planner speed: `testbed plan` for the 3,456-GPU job (GPT-3 175B, global batch 1,728, topologies/3dc.yaml).

Prints the planner's wall time, CPU time (this process and its simulation processes), the layouts it
estimated (and how many fit in memory), how many it simulated, the chosen plan, and how far the
analytic estimate was from the simulator on every simulated layout. For scale: Sailor's planner
evaluates 1,530 plans in 36 s for the same job size. A benchmark, not a test: numbers vary by machine
and load. Run: .venv/bin/python bench/planner_speed.py [--top N] [--topology PATH]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

from testbed.runs.select import search
from testbed.spec.experiment import Experiment
from testbed.spec.load import load_topology

ROOT = Path(__file__).resolve().parent.parent


def cpu_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=2, help="layouts per DC set scored by the simulator")
    ap.add_argument("--topology", default=str(ROOT / "topologies" / "3dc.yaml"))
    ap.add_argument("--scheduler", default="atlas")
    args = ap.parse_args()
    exp = Experiment(topology=load_topology(args.topology), schedulers=[args.scheduler],
                     workload={"model": "gpt3-175b", "global_batch": 1728, "sequence_parallel": True})
    gpus = sum(d.gpus for d in exp.topology.dcs)
    c0, t0 = cpu_s(), time.perf_counter()
    res = search(exp, args.scheduler, top=args.top)
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    b = res.best
    print(f"job: gpt3-175b, global batch 1728, {gpus:,} free GPUs in {len(exp.topology.dcs)} DCs "
          f"({Path(args.topology).name}), scheduler {args.scheduler}, top {args.top} per DC set")
    print(f"layouts estimated: {res.layouts:,} ({res.fit:,} fit in memory) in {res.estimate_wall_s:.2f} s")
    print(f"simulated: {res.simulated} (incl. the best plan's lower bound)")
    print(f"planner wall time: {wall:.2f} s, CPU time: {cpu:.2f} s "
          f"(Sailor: 1,530 plans in 36 s; here {res.layouts / wall:,.0f} layouts/s)")
    if b is not None:
        lay = b.layout
        print(f"best: {' > '.join(lay.order)} {lay.counts}, tp {lay.tp}, pp {lay.pp}, dp {lay.dp}, "
              f"microbatch {lay.microbatch}: {b.iteration_s:.3f} s/iteration, {b.tokens_per_s:,.0f} tokens/s, "
              f"{b.gpus:,} GPUs, {b.idle_gpus:,} idle")
    errs = [abs(c.estimate_s - c.iteration_s) / c.iteration_s for c in res.candidates if c.iteration_s]
    if errs:
        print(f"estimate vs simulator on the {len(errs)} simulated layouts: median {statistics.median(errs):.2%}, "
              f"max {max(errs):.2%}")
    for s in res.sets:
        c = s.best
        what = (f"tp {c.layout.tp} pp {c.layout.pp:>2} dp {c.layout.dp:>3} mb {c.layout.microbatch}: "
                f"{c.tokens_per_s:>12,.0f} tokens/s, {c.idle_gpus:,} of {s.free_gpus:,} GPUs idle" if c
                else f"nothing fits: {s.problem}")
        print(f"  {s.dcs:<28} {what}")


if __name__ == "__main__":
    main()

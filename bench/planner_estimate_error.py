"""How far the planner's analytic estimate is from the simulator, on jobs the estimate was not tuned on.

The estimate's terms were checked against the simulator on GPT-3 175B over topologies/3dc.yaml (atlas and
pp-wan+greedy, default latencies). This script measures it elsewhere: mixed GPUs, another model and
batch, longer WAN latencies, GPipe. For each job it runs the planner with the best 3 layouts of every
DC set simulated and prints the relative error (estimate - simulated) / simulated over those layouts,
and how much slower than the set's simulated best the estimate's first choice in each DC set is (at
worst over the sets: what trusting the estimate alone would cost). A benchmark, not a test.
With --families the jobs scored by atlas are searched with every family too (runs/families.py) and each
family gets its own row (its estimate: plan/estimate_dp.py).
Run: .venv/bin/python bench/planner_estimate_error.py [--families] [--only TEXT]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from testbed.runs.families import FAMILIES
from testbed.runs.select import search
from testbed.spec.experiment import Experiment
from testbed.spec.load import load_topology

ROOT = Path(__file__).resolve().parent.parent
TWO_DC = {"name": "2dc", "dcs": [{"name": "east", "gpus": 512}, {"name": "west", "gpus": 512}],
          "links": [{"between": ["east", "west"], "gbps": 400, "latency_ms": 33}]}
JOBS = [
    ("gpt3-175b on mixed-3dc (A100/H100/H200)", "mixed-3dc.yaml", {}, "atlas"),
    ("gpt3-175b on mixed-3dc (A100/H100/H200)", "mixed-3dc.yaml", {}, "pp-wan+greedy"),
    ("llama3-70b, batch 512, on 2 x 512 H100", TWO_DC, {"model": "llama3-70b", "global_batch": 512}, "atlas"),
    ("llama3-70b, batch 512, on 2 x 512 H100", TWO_DC, {"model": "llama3-70b", "global_batch": 512}, "pp-1tcp+greedy"),
    ("gpt3-175b on 3dc, every link 50 ms", "3dc.yaml@50", {}, "atlas"),
    ("gpt3-175b on 3dc, GPipe", "3dc.yaml", {"schedule": "gpipe"}, "atlas"),
    ("gpt3-175b on 3dc, turns by microbatch", "3dc.yaml", {}, "atlas"),
]
NETWORK = {"gpt3-175b on 3dc, turns by microbatch": {"turn_order": "microbatch"}}


def topology(spec):
    if isinstance(spec, dict):
        return spec
    name, _, lat = spec.partition("@")
    topo = load_topology(ROOT / "topologies" / name).model_dump()
    for link in topo["links"]:
        if lat:
            link["latency_ms"] = float(lat)
    return topo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", action="store_true", help="every family on the jobs scored by atlas")
    ap.add_argument("--only", default="", help="only the jobs whose title contains this")
    a = ap.parse_args()
    print(f"{'job':<44}{'scheduler':<18}{'layouts':>8}{'median':>9}{'max':>9}{'bias':>9}"
          f"{'multi-DC median':>17}{'first choice slower by':>24}")
    for title, topo, workload, sched in JOBS:
        if a.only not in title:
            continue
        exp = Experiment(topology=topology(topo), schedulers=[sched], network=NETWORK.get(title, {}),
                         workload={"model": "gpt3-175b", "global_batch": 1728, "sequence_parallel": True, **workload})
        fams = list(FAMILIES) if a.families and sched == "atlas" else None
        res = search(exp, sched, top=3, families=fams)
        for fam in fams or ["pipeline"]:
            report(title, sched if fam == "pipeline" else FAMILIES[fam], [c for c in res.candidates if c.family == fam],
                   [s for s in res.sets if s.family == fam])


def report(title: str, sched: str, cands: list, sets: list) -> None:
    """One row: the estimate's error over the simulated layouts of one family."""
    sims = [c for c in cands if c.iteration_s]
    if not sims:
        print(f"{title:<44}{sched:<18}{0:>8}")
        return
    errs = [(c.estimate_s - c.iteration_s) / c.iteration_s for c in sims]
    multi = [abs(e) for e, c in zip(errs, sims, strict=True) if "|" in c.dcs] or [float("nan")]
    worst = 0.0
    for s in sets:
        mine = [c for c in sims if c.dcs == s.dcs]
        if mine and s.best is not None:
            first = min(mine, key=lambda c: (c.estimate_s, -c.gpus, c.key()))
            worst = max(worst, first.iteration_s / s.best.iteration_s - 1)
    print(f"{title:<44}{sched:<18}{len(errs):>8}{statistics.median(map(abs, errs)):>9.1%}"
          f"{max(map(abs, errs)):>9.1%}{statistics.mean(errs):>+9.1%}{statistics.median(multi):>17.1%}"
          f"{worst:>24.2%}")


if __name__ == "__main__":
    main()

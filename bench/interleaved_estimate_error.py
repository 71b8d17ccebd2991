"""How far the planner's estimate of interleaved 1F1B (virtual_stages > 1) is from the simulator.

For a few jobs (one DC; two and three DCs at 5 and 30 ms, three schedulers) and v = 1, 2, 4, builds the plan
the simulator runs, estimates the same layout (`plan/estimate.py`) and prints both iteration times and the
relative error (estimate - simulated) / simulated. A benchmark, not a test: docs/planner.md quotes it.
Run: .venv/bin/python bench/interleaved_estimate_error.py
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.costs.models import resolve_model  # noqa: E402
from testbed.errors import SpecError  # noqa: E402
from testbed.plan.estimate import Estimator, Layout  # noqa: E402
from testbed.sim.choose import build_plan  # noqa: E402
from testbed.sim.executor import simulate  # noqa: E402
from testbed.spec.experiment import Experiment  # noqa: E402
from testbed.spec.mechanisms import parse_scheduler  # noqa: E402
from testbed.spec.topology import Topology  # noqa: E402


def topo(dcs: list[tuple[str, int]], gbps: float, latency_ms: float) -> Topology:
    return Topology(dcs=[{"name": n, "gpu": "H100", "gpus": k} for n, k in dcs],
                    links=[{"between": [a[0], b[0]], "gbps": gbps, "latency_ms": latency_ms}
                           for a, b in itertools.combinations(dcs, 2)])


def errors(t: Topology, sched: str, dp: int, workload: dict) -> list[str]:
    out = []
    for v in (1, 2, 4):
        exp = Experiment(topology=t, schedulers=[sched], workload={**workload, "virtual_stages": v})
        try:
            plan = build_plan(exp, sched, dp=dp)
        except SpecError as e:
            out.append(f"v={v}: {e}")
            continue
        row = plan.stage_dc[0]
        order = tuple(dict.fromkeys(row))
        lay = Layout(order, tuple(row.count(d) for d in order), exp.workload.tp, exp.workload.pp, dp,
                     exp.workload.microbatch)
        est = Estimator(exp, resolve_model(exp.workload.model), parse_scheduler(sched))(lay).iteration_s
        sim = simulate(plan)[0].iteration_s[0]
        out.append(f"v={v}: {sim:7.3f} s sim, {est:7.3f} s est, {est / sim - 1:+6.1%}")
    return out


def main() -> None:
    llama = {"model": "llama3-70b", "tp": 8, "pp": 8, "global_batch": 128, "microbatch": 1}
    gpt3 = {"model": "gpt3-175b", "tp": 8, "pp": 12, "global_batch": 768, "microbatch": 1}
    jobs = [("Llama-3 70B, one DC", Topology(dcs=[{"name": "a", "gpus": 1024}]), "atlas", 2, llama)]
    for lat in (5, 30):
        two = topo([("a", 64), ("b", 64)], 400, lat)
        three = topo([("a", 128), ("b", 128), ("c", 128)], 100, lat)
        jobs += [(f"Llama-3 70B, 2 DCs, {lat} ms", two, s, 2, llama) for s in ("atlas", "pp-wan+greedy", "pp-1tcp")]
        jobs += [(f"GPT-3 175B, 3 DCs, {lat} ms", three, s, 4, gpt3) for s in ("atlas", "pp-wan+greedy")]
    for title, t, sched, dp, w in jobs:
        print(f"{title:<28}{sched:<15}" + " | ".join(errors(t, sched, dp, w)), flush=True)


if __name__ == "__main__":
    main()

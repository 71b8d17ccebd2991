"""Which transfer goes first on a WAN link under temporal sharing? Atlas with each turn order
(testbed/plan/turns.py), on GPipe and 1F1B, with 1 to 64 replicas and three WAN capacities, from one
simulator run.

Run: .venv/bin/python bench/turn_orders.py [--quick]
Prints a table of iteration times where the order matters (uncontended rows are left out), each
order's slowdown against the best order of its row, and the geometric mean of those slowdowns per order.
"""

from __future__ import annotations

import math
import sys

from testbed.plan.turns import TURN_KEYS
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.spec.experiment import Experiment


def experiment(schedule: str, dp: int, order: str, gbps: float, microbatches: int) -> Experiment:
    """GPT-3 175B (tp 8, pp 12, full recompute so GPipe fits) on the 3dc latencies at `gbps`, DCs big
    enough for 64 replicas."""
    dcs = [{"name": n, "gpu": "H100", "gpus": 8 * 4 * 64} for n in ("useast", "uscentral", "uswest")]
    links = [{"between": ["useast", "uscentral"], "gbps": gbps, "latency_ms": 14},
             {"between": ["uscentral", "uswest"], "gbps": gbps, "latency_ms": 19},
             {"between": ["useast", "uswest"], "gbps": gbps, "latency_ms": 33}]
    return Experiment.model_validate({
        "topology": {"name": "3dc-big", "dcs": dcs, "links": links},
        "workload": {"model": "gpt3-175b", "global_batch": microbatches * dp, "microbatch": 1, "tp": 8, "pp": 12,
                     "dp": dp, "schedule": schedule, "recompute": "full"},
        "schedulers": ["atlas"], "network": {"turn_order": order}})


def main() -> None:
    quick = "--quick" in sys.argv
    orders = [*TURN_KEYS, "auto"]
    dps = [2, 8] if quick else [4, 8, 16, 32, 64]
    capacities = [100] if quick else [50, 100, 200, 400]
    per_replica = [16] if quick else [16, 48]  # microbatches per replica
    print("| schedule | microbatches | Gbit/s | dp | " + " | ".join(f"{o} (s)" for o in orders) + " | " +
          " | ".join(f"{o} / best" for o in orders) + " |")
    print("|" + "---|" * (4 + 2 * len(orders)))
    ratios: dict[str, list[float]] = {o: [] for o in orders}
    for schedule in ("gpipe", "1f1b"):
        for m in per_replica:
            for gbps in capacities:
                for dp in dps:
                    its = {o: simulate(build_plan(experiment(schedule, dp, o, gbps, m), "atlas"))[0].iteration_s[0]
                           for o in orders}
                    best = min(its.values())
                    if max(its.values()) / best - 1 < 1e-9:
                        continue  # the link is not contended: every order gives the same time
                    for o in orders:
                        ratios[o].append(its[o] / best)
                    print(f"| {schedule} | {m} | {gbps} | {dp} | " + " | ".join(f"{its[o]:.3f}" for o in orders)
                          + " | " + " | ".join(f"{its[o] / best:.3f}" for o in orders) + " |", flush=True)
    print("\nrows where the order matters; geometric mean of order / best over them: " + ", ".join(
        f"{o} {math.prod(r) ** (1 / len(r)):.3f} (worst {max(r):.3f})" for o, r in ratios.items()))


if __name__ == "__main__":
    main()

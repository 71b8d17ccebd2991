"""How well the in-run replay (testbed/bubbletea/without_prefill.py) measures training's slowdown from prefill,
checked where the truth is known: the simulator's realised BubbleTea runs, whose every iteration is also run with
the same noise and no prefill. Per case and iteration: the true slowdown (with / without - 1) against the
replay's, from the timeline with prefill alone. The replay cannot see a transfer that prefill slowed (a KV cache
on the link, a send moved in the link's sharing), so where those matter it reads low; the bench says by how much.

Run: .venv/bin/python bench/paired_slowdown.py [--seeds 3]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from statistics import median

from testbed.bubbletea.realised import realised_run
from testbed.bubbletea.run import group_cost_table, home_dcs, kv_transfer, requests_for
from testbed.bubbletea.without_prefill import paired_slowdowns
from testbed.costs.prefill import inference_model, kv_bytes_per_token
from testbed.plan.lower import lower
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.spec.load import load_experiment

ROOT = Path(__file__).resolve().parent.parent
# (experiment, scheduler, extra settings): noise as measured from the emulated runs (docs/bubbletea.md), and
# harsher; no guard band, so that training does wait
CASES = [
    ("emu-bubbletea.yaml", "atlas+bubbletea", ["bubbletea.guard_ms=0"]),
    ("emu-bubbletea.yaml", "pp-wan+bubbletea", ["bubbletea.guard_ms=0"]),
    ("emu-bubbletea.yaml", "atlas+bubbletea", ["bubbletea.guard_ms=0", "bubbletea.rate_scale=30"]),
    ("emu-bubbletea-far.yaml", "atlas+bubbletea", ["bubbletea.guard_ms=0"]),
    ("emu-bubbletea.yaml", "atlas+bubbletea", ["bubbletea.guard_ms=2", "workload.dp=1"]),
    ("emu-bubbletea.yaml", "atlas+bubbletea", ["bubbletea.guard_ms=0", "bubbletea.rate_scale=20", "workload.dp=1"]),
    ("emu-bubbletea.yaml", "pp-wan+bubbletea", ["bubbletea.guard_ms=0", "bubbletea.rate_scale=20", "workload.dp=1"]),
]
NOISE = [("0.06/0.1", ["bubbletea.jitter_compute_cv=0.06", "bubbletea.jitter_wan_cv=0.1"]),
         ("0.2/0.3", ["bubbletea.jitter_compute_cv=0.2", "bubbletea.jitter_wan_cv=0.3"])]


def one(name: str, sched: str, sets: list[str], seed: int, iterations: int = 10) -> tuple[list[float], list[float]]:
    """(true, replayed) slowdown per steady iteration of one realised run."""
    (exp, _), = load_experiment(ROOT / "experiments" / name, sets=[f"schedulers=[{sched}]", f"seed={seed}", *sets])
    plan = build_plan(exp, sched)
    opts = exp.bubbletea
    horizon = simulate(plan)[0].iteration_s[0] * (iterations + 1)
    reqs = requests_for(opts, horizon, exp.seed)
    costs, _max_tokens = group_cost_table(plan, opts)
    homes = home_dcs(reqs, plan.dcs_used(), exp.seed)
    model = inference_model(opts.model)
    tl, _real, _joins, durations, base, _chunks = realised_run(
        plan, reqs, homes, costs, kv_transfer(plan, opts), opts, exp.seed, iterations, model.layers,
        kv_bytes_per_token(model))
    true = [d / b - 1 for d, b in zip(durations, base, strict=True)]
    return true, paired_slowdowns(lower(plan), tl, first=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    print("case | noise cv (compute/WAN) | true median / replay median | per iteration: |replay - true| median, "
          "worst | replay low by > 0.5 pt")
    for name, sched, sets in CASES:
        for label, noise in NOISE:
            t_all, r_all = [], []
            for seed in range(1, args.seeds + 1):
                t, r = one(name, sched, [*sets, *noise], seed)
                t_all += t
                r_all += r
            diff = [r - t for t, r in zip(t_all, r_all, strict=True)]
            low = sum(d < -0.005 for d in diff)
            slowed = [(t, r) for t, r in zip(t_all, r_all, strict=True) if t > 0.002]
            within = sum(abs(r - t) <= 0.1 * t + 0.001 for t, r in slowed)
            print(f"{name} {sched} {' '.join(sets)} | {label} | {median(t_all):+.2%} / {median(r_all):+.2%} | "
                  f"{median(abs(d) for d in diff):.2%}, {max(diff, key=abs):+.2%} | {low} of {len(diff)} | "
                  f"{len(slowed)} | {within} | {max((t for t, _ in slowed), default=0):.2%}")


if __name__ == "__main__":
    main()

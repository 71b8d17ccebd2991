"""Speedups of Atlas on experiments/paper-3dc.yaml, from one simulator run (the README's table).

Run: .venv/bin/python bench/paper_speedups.py [RESULTS_DIR]  (reads RESULTS_DIR/summary.csv if given,
else simulates the experiment now)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from testbed.sim.run import run_experiment
from testbed.spec.load import load_experiment

EXP = Path(__file__).resolve().parent.parent / "experiments" / "paper-3dc.yaml"


def main() -> None:
    if len(sys.argv) > 1:
        d = pd.read_csv(Path(sys.argv[1]) / "summary.csv")
    else:
        d = pd.DataFrame([r.summary for r in run_experiment(load_experiment(EXP, sets=["timeline=none"]))])
    d = d[d.source == "sim"]
    it = d.pivot_table(index="wan_latency_ms", columns="scheduler", values="iteration_s")
    lb = d[d.scheduler == "atlas"].set_index("wan_latency_ms").lower_bound_s
    cols = [c for c in ["dp-wan", "pp-wan", "pp-wan+temporal", "pp-wan+mtcp", "atlas"] if c in it]
    print("| one-way latency (ms) | " + " | ".join(f"{c} (s)" for c in cols)
          + " | lower bound (s) | atlas vs pp-wan | atlas vs dp-wan | atlas / lower bound |")
    print("|" + "---|" * (len(cols) + 5))
    for lat, row in it.iterrows():
        print(f"| {lat:g} | " + " | ".join(f"{row[c]:.2f}" for c in cols)
              + f" | {lb[lat]:.2f} | {row['pp-wan'] / row['atlas']:.1f}x | {row['dp-wan'] / row['atlas']:.1f}x"
              f" | {row['atlas'] / lb[lat]:.2f} |")
    util = d.groupby("scheduler", sort=False)[["gpu_util", "bubble_frac"]].mean()
    print("\nmean over the sweep: " + ", ".join(f"{s} gpu_util {u.gpu_util:.0%}" for s, u in util.iterrows()))


if __name__ == "__main__":
    main()

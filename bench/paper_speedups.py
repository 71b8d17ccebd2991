"""Atlas on experiments/paper-3dc.yaml (GPT-3 175B, 3,456 H100s, 3 DCs), one simulator run: every
scheduler's iteration time at each one-way latency, and Atlas's speedup over the one-connection
pipeline, over Megatron-LM as deployed (pp-wan) and over the fastest baseline at that latency.

Run: .venv/bin/python bench/paper_speedups.py [RESULTS_DIR]  (reads RESULTS_DIR/summary.csv if given,
else simulates the experiment now)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from testbed.runs.simulated import run_experiment
from testbed.spec.load import load_experiment

EXP = Path(__file__).resolve().parent.parent / "experiments" / "paper-3dc.yaml"


def main() -> None:
    if len(sys.argv) > 1:
        d = pd.read_csv(Path(sys.argv[1]) / "summary.csv")
    else:
        d = pd.DataFrame([r.summary for r in run_experiment(load_experiment(EXP, sets=["timeline=none"]))])
    d = d[d.source == "sim"]
    it = d.pivot_table(index="wan_latency_ms", columns="scheduler", values="iteration_s")
    atlas = d[d.scheduler == "atlas"].set_index("wan_latency_ms")
    cols = list(dict.fromkeys(d.scheduler))
    print("| one-way latency (ms) | " + " | ".join(f"{c} (s)" for c in cols)
          + " | lower bound (s) | atlas vs pp-1tcp | atlas vs pp-wan | best baseline | atlas vs best |")
    print("|" + "---|" * (len(cols) + 6))
    for lat, row in it.iterrows():
        a = atlas.loc[lat]
        print(f"| {lat:g} | " + " | ".join(f"{row[c]:.2f}" for c in cols)
              + f" | {a.lower_bound_s:.2f} | {row['pp-1tcp'] / row['atlas']:.1f}x | {row['pp-wan'] / row['atlas']:.2f}x"
              f" | {a.best_baseline} | {a.speedup_vs_best:.2f}x |")


if __name__ == "__main__":
    main()

"""Side by side: wall-clock time to a target loss of the runs in one folder (examples/diloco.py writes
one <method>.csv per run: ddp, diloco, streaming), printed, written as convergence.csv and drawn as
loss_vs_wall.png. Against ddp, each method's steps to the target give its measured token efficiency (ddp's
steps / its steps, every method taking the same batch per step): the check of `workload.token_efficiency`.

    .venv/bin/python examples/compare_loss.py results/diloco --target 2.0
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from testbed.analysis.convergence import CONVERGENCE_HEADER, convergence_row
from testbed.figures.launch import loss_vs_wall
from testbed.results import write_csv


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--target", type=float, required=True, help="held-out loss to reach")
    a = p.parse_args()
    runs = {}
    for f in sorted(a.folder.glob("*.csv")):
        with open(f) as fh:
            rows = list(csv.DictReader(fh))
        if rows and {"method", "wall_s", "eval_loss"} <= set(rows[0]):
            runs[rows[0]["method"]] = rows
    if not runs:
        raise SystemExit(f"{a.folder}: no run CSVs (method, step, wall_s, loss, eval_loss)")
    ks = {rows[0].get("scale") or "1" for rows in runs.values()}
    if ks != {"1"}:  # diloco.py records TESTBED_SCALE: its tensors are real-sized, its times the emulated WAN's
        print(f"runs on an emulated WAN at k={', '.join(sorted(ks))}: times are that WAN's, not the spec's")
    table = [convergence_row(m, rows, a.target) for m, rows in runs.items()]
    write_csv(a.folder / "convergence.csv", CONVERGENCE_HEADER, table)
    png = loss_vs_wall(runs, a.target, a.folder / "loss_vs_wall.png")
    head = f"time to loss <= {a.target:g}"
    print(f"{'method':<8} {head:>22} {'steps':>6} {'s/step':>8} {'final loss':>11}")
    for m, _t, tt, st, fin, _steps, _wall, sps in table:
        reached = f"{tt:.2f} s" if tt != "" else "not reached"
        print(f"{m:<8} {reached:>22} {st!s:>6} {sps:>8} {fin!s:>11}")
    hit = {r[0]: (r[2], r[3]) for r in table if r[2] != ""}
    if "ddp" in hit:
        t_ddp, s_ddp = hit["ddp"]
        for m, (t, steps) in hit.items():
            if m != "ddp":
                print(f"{m} reaches the target {t_ddp / t:.1f}x sooner than ddp; measured token efficiency "
                      f"{s_ddp / steps:.2f} (ddp's steps / its steps, at H-step resolution)")
    print(f"wrote {a.folder / 'convergence.csv'}, {png}")


if __name__ == "__main__":
    main()

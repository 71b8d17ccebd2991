"""When does each activation arrive? The emulated and simulated arrival times of every transfer of
replica 0 on experiments/emu-4dc-gpipe.yaml (GPipe: all forwards are issued at once, so activations
queue on each stage boundary's connections), measured from the iteration's start.

Run (root): .venv/bin/python bench/gpipe_arrivals.py [RESULTS_DIR] [--prefix gdtbN]
With RESULTS_DIR holding an earlier `testbed experiment run` of it, reads that instead of running it.
Prints, per scheduler and stage, the arrival times and the median and worst relative error of the
simulated ones (microbatch 0, whose first transfer also carries TCP's start, is shown apart).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
EXP = ROOT / "experiments" / "emu-4dc-gpipe.yaml"


def arrivals(tl: pd.DataFrame, run_id: str, source: str) -> dict[tuple[int, str, int], float]:
    """(stage, kind, microbatch) -> arrival time after the iteration's start, replica 0, in the first
    steady iteration. A stage gets a microbatch's activation before its gradient (kind "a", then "g")."""
    d = tl[(tl.run_id == run_id) & (tl.source == source)]
    d = d[d.iteration == (1 if source == "emu" else 0)]
    t0 = d.start_s.min()
    recv = d[(d.kind == "recv") & (d.replica == 0)].sort_values("end_s")
    out: dict[tuple[int, str, int], float] = {}
    for row in recv.itertuples():
        kind = "g" if (row.stage, "a", row.microbatch) in out or row.stage == 0 else "a"
        out[(row.stage, kind, row.microbatch)] = row.end_s - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", help="an earlier run's results folder")
    ap.add_argument("--prefix", help="emulation prefix (default: a free one)")
    a = ap.parse_args()
    if a.results:
        out = Path(a.results)
    else:
        out = Path(tempfile.mkdtemp(prefix="gpipe-arrivals-"))
        cmd = [sys.executable, "-m", "testbed", "experiment", "run", str(EXP), "--out", str(out)]
        subprocess.run(cmd + (["--prefix", a.prefix] if a.prefix else []), check=True, cwd=ROOT)
    tl = pd.read_csv(out / "timeline.csv")
    for run_id in tl.run_id.unique():
        sim, emu = arrivals(tl, run_id, "sim"), arrivals(tl, run_id, "emu")
        errs = []
        print(f"\n{run_id}: activation arrivals of replica 0 (s after the iteration's start), emulated / simulated")
        for stage in sorted({k[0] for k in sim if k[1] == "a"}):
            keys = sorted(k for k in sim if k[0] == stage and k[1] == "a" and k in emu)
            print(f"  stage {stage}: " + "  ".join(f"{emu[k]:.3f}/{sim[k]:.3f}" for k in keys))
            errs += [(sim[k] - emu[k]) / emu[k] for k in keys if k[2] > 0]
        if errs:
            print(f"  error of the simulated arrivals (microbatches 1+): median {statistics.median(errs):+.1%}, "
                  f"worst {max(errs, key=abs):+.1%}")


if __name__ == "__main__":
    main()

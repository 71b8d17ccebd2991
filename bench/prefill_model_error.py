"""Error of the prefill cost model against measured prompt times (Splitwise perf_model.csv).

Prints the median and p90 absolute relative error per (model, GPU, TP) it covers and overall.
--fit refits the calibration and prints it in the form testbed/costs/prefill.py holds.
Run: .venv/bin/python bench/prefill_model_error.py [PATH_TO_perf_model.csv] [--fit]
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from testbed.costs.prefill import fit, load_perf_rows, relative_errors

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "splitwise-perf-model" / "perf_model.csv"


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    path = Path(args[0]) if args else DEFAULT
    if not path.exists():
        raise SystemExit(f"{path} not found: download perf_model.csv from the splitwise-sim repository (data/)")
    rows = load_perf_rows(path)
    cal = fit(rows) if "--fit" in sys.argv else None
    if cal:
        for k, v in cal.items():
            print(f"    {k!r}: Calibration({v.overhead_per_layer_s:.6g}, {v.e_mm:.4f}, {v.e_attn:.4f}),")
    errs = relative_errors(rows, cal)
    by = defaultdict(list)
    for e in errs:
        by[(e["model"], e["gpu"], e["tp"])].append(e["rel_err"])
    print(f"{'model':<12}{'GPU':<6}{'TP':>3}{'rows':>6}{'median err':>12}{'p90 err':>9}")
    for (m, g, tp), v in sorted(by.items()):
        print(f"{m:<12}{g:<6}{tp:>3}{len(v):>6}{np.median(v):>12.1%}{np.percentile(v, 90):>9.1%}")
    allv = [e["rel_err"] for e in errs]
    print(f"{'all covered':<21}{len(allv):>6}{np.median(allv):>12.1%}{np.percentile(allv, 90):>9.1%}   "
          f"(of {len(rows)} rows; TP 2 and power-capped H100 rows are not covered)")


if __name__ == "__main__":
    main()

"""Error of the operator compute model (testbed/costs/operators.py) against published training throughputs.

Reads bench/data/published_training.csv (each row: model, GPUs, tp/pp/dp, sequence, batch, recompute,
schedule, the measured throughput and its source). One constant is fitted, on one source only (default
llama3-2024): `overhead`, the median ratio of measured to predicted iteration time there (what a
framework adds over its kernels: data loading, synchronisation, kernels the model does not list). The
other sources are held out. Prints each row's error, the error per source, and the held-out median and
worst |error|.

Rows with an interleaved schedule use the pipeline bubble (pp - 1) / v of v virtual stages in the
bench's own iteration formula (testbed/costs/published.py), not the simulator.
Run: .venv/bin/python bench/compute_model_error.py [CSV] [--fit-on SOURCE] [--rows]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testbed.costs.operators import COMPUTE_OVERHEAD  # noqa: E402
from testbed.costs.published import load_rows, predicted  # noqa: E402

DEFAULT = ROOT / "bench" / "data" / "published_training.csv"


def fit_overhead(rows: list) -> float:
    """The median of measured-over-predicted iteration time (throughputs: predicted over measured)."""
    return median(predicted(r, 1.0) / r.measured for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", default=str(DEFAULT))
    ap.add_argument("--fit-on", default="llama3-2024", help="the one source the overhead is fitted on ('' = none)")
    ap.add_argument("--rows", action="store_true", help="print every row")
    a = ap.parse_args(argv)
    rows = load_rows(a.csv)
    fitted = [r for r in rows if r.source == a.fit_on]
    overhead = fit_overhead(fitted) if fitted else 1.0
    print(f"overhead fitted on {a.fit_on or 'nothing'} ({len(fitted)} rows): {overhead:.3f} "
          f"(testbed/costs/operators.py ships COMPUTE_OVERHEAD = {COMPUTE_OVERHEAD})")
    by: dict[str, list[float]] = {}
    for r in rows:
        err = predicted(r, overhead) / r.measured - 1
        by.setdefault(r.source, []).append(err)
        if a.rows:
            print(f"  {r.source:22s} {r.model.name:12s} {r.gpu:5s} gpus={r.gpus:<6d} tp={r.tp} pp={r.pp:<3d} "
                  f"s={r.model.seq_len:<5d} B={r.global_batch:<5d} mb={r.microbatch:<3d} {r.recompute:5s} "
                  f"measured {r.measured:9.1f} predicted {predicted(r, overhead):9.1f} {r.unit}  {err:+.1%}")
    print(f"{'source':22s} {'rows':>4s} {'median |err|':>12s} {'worst |err|':>11s} {'median err':>10s}  fitted")
    held: list[float] = []
    for src, errs in by.items():
        absd = [abs(e) for e in errs]
        print(f"{src:22s} {len(errs):4d} {median(absd):12.1%} {max(absd):11.1%} {median(errs):+10.1%}  "
              f"{'yes' if src == a.fit_on else 'no'}")
        if src != a.fit_on:
            held += absd
    if held:
        print(f"held out: {len(held)} rows, median |err| {median(held):.1%}, worst |err| {max(held):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

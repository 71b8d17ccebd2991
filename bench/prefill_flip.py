"""What making the operator prefill model (costs/prefill_ops.py) BubbleTea's default would move, simulated.

Fits the operator model's four constants per GPU on the Splitwise rows (as bench/prefill_model_error.py
does), then simulates a BubbleTea experiment (default experiments/bubbletea-3dc.yaml with its own trace)
twice with the same code: with the shipped fitted curve (costs/prefill.py), and with the operator model in
its place in the simulator (`bubbletea/run.py`'s prefill_time_s and chunk_time_s; the emulated service is
not switched). Runs are paired by run_id; prints each column's median change and range.
Run: .venv/bin/python bench/prefill_flip.py [PERF_CSV] [EXP.yaml]
"""

from __future__ import annotations

import sys
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import testbed.bubbletea.run as bubbletea_run  # noqa: E402
from testbed.costs import prefill_ops  # noqa: E402
from testbed.costs.prefill import HARDWARE, consistent_rows, coverage, dedupe, load_perf_rows  # noqa: E402
from testbed.runs.simulated import run_experiment  # noqa: E402
from testbed.spec.load import load_experiment  # noqa: E402

PERF = ROOT.parent / "shared" / "data" / "splitwise-perf-model" / "perf_model.csv"
EXP = ROOT / "experiments" / "bubbletea-3dc.yaml"
COLUMNS = ("ttft_p50_ms", "ttft_p99_ms", "slo_attainment", "served_in_bubbles", "prefill_util", "iteration_s")


def operator_model(perf_csv: Path):
    """prefill_time_s and chunk_time_s from the operators, calibrated per GPU on the Splitwise rows."""
    rows, _ = consistent_rows(dedupe([r for r in load_perf_rows(perf_csv) if r["hardware"] in HARDWARE]))
    cal = prefill_ops.fit_rows(rows)

    def prefill_time_s(model, gpu, tp, tokens, batch=1, cal_=None):
        if tokens <= 0:
            return 0.0
        return prefill_ops.ops_time_s(prefill_ops.pass_ops(model, gpu, tp, tokens, batch), cal[coverage(gpu)[0]])

    def chunk_time_s(model, gpu, tp, done, chunk, cal_=None):
        if chunk <= 0:
            return 0.0
        work = prefill_ops.pass_ops(model, gpu, tp, chunk, 1, cached=done)
        return prefill_ops.ops_time_s(work, cal[coverage(gpu)[0]])

    return prefill_time_s, chunk_time_s


def summaries(exp: Path) -> dict[str, dict]:
    return {r.summary["run_id"]: r.summary for r in run_experiment(load_experiment(exp, sets=["timeline=none"]))}


def main() -> int:
    args = sys.argv[1:]
    perf = Path(args[0]) if args else PERF
    exp = Path(args[1]) if len(args) > 1 else EXP
    shipped = summaries(exp)
    bubbletea_run.prefill_time_s, bubbletea_run.chunk_time_s = operator_model(perf)
    ops = summaries(exp)
    ids = [i for i in shipped if i in ops]
    print(f"{exp.name}: {len(ids)} runs, shipped prefill curve -> operator prefill model")
    print(f"{'column':<20}{'shipped (median)':>18}{'operators (median)':>20}  change: median (range)")
    for col in COLUMNS:
        pairs = [(float(shipped[i][col]), float(ops[i][col])) for i in ids
                 if shipped[i].get(col) not in ("", None) and ops[i].get(col) not in ("", None)]
        if not pairs:
            continue
        ch = [b / a - 1 for a, b in pairs if a]
        rng = f"{median(ch):+.1%} ({min(ch):+.1%} to {max(ch):+.1%})" if ch else "n/a"
        print(f"{col:<20}{median(a for a, _ in pairs):>18.4g}{median(b for _, b in pairs):>20.4g}  {rng}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

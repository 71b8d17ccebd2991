"""What the prefill model moves in a simulated BubbleTea experiment: `bubbletea.prefill_model` curve -> ops.

Simulates a BubbleTea experiment (default experiments/bubbletea-3dc.yaml with its own trace) twice with the
same code, with the fitted curve (costs/prefill.py) and with the operator model (costs/prefill_ops.py, the
default), pairs the runs by run_id and prints each column's median change and range.
Run: .venv/bin/python bench/prefill_flip.py [EXP.yaml]
"""

from __future__ import annotations

import sys
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testbed.runs.simulated import run_experiment  # noqa: E402
from testbed.spec.load import load_experiment  # noqa: E402

EXP = ROOT / "experiments" / "bubbletea-3dc.yaml"
COLUMNS = ("ttft_p50_ms", "ttft_p99_ms", "slo_attainment", "served_in_bubbles", "prefill_util", "iteration_s")


def summaries(exp: Path, kind: str) -> dict[str, dict]:
    pts = load_experiment(exp, sets=["timeline=none", f"bubbletea.prefill_model={kind}"])
    return {r.summary["run_id"]: r.summary for r in run_experiment(pts)}


def main() -> int:
    args = sys.argv[1:]
    exp = Path(args[0]) if args else EXP
    curve = summaries(exp, "curve")
    ops = summaries(exp, "ops")
    ids = [i for i in curve if i in ops]
    print(f"{exp.name}: {len(ids)} runs, prefill_model curve -> ops (the default)")
    print(f"{'column':<20}{'curve (median)':>18}{'ops (median)':>20}  change: median (range)")
    for col in COLUMNS:
        pairs = [(float(curve[i][col]), float(ops[i][col])) for i in ids
                 if curve[i].get(col) not in ("", None) and ops[i].get(col) not in ("", None)]
        if not pairs:
            continue
        ch = [b / a - 1 for a, b in pairs if a]
        rng = f"{median(ch):+.1%} ({min(ch):+.1%} to {max(ch):+.1%})" if ch else "n/a"
        print(f"{col:<20}{median(a for a, _ in pairs):>18.4g}{median(b for _, b in pairs):>20.4g}  {rng}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What flipping `workload.mfu`'s default from the typed 0.5 to `auto` moved, per shipped experiment.

Each experiment (default: every experiments/*.yaml the simulator runs) is simulated twice with the same code:
with the old default typed (`workload.mfu=0.5`, unless the spec types its own `mfu`, then as shipped), and with
`workload.mfu=auto` (layer times from operators, docs/compute.md: the default). Runs are paired by
run_id. Printed as a markdown table: whether the spec types `mfu` itself (then the flip of the default alone
leaves it as it is), the runs, the median iteration_s of each, the change (median, min, max), the reported
`mfu` of each (an output either way: model FLOPs / iteration / GPUs / peak, bubbles included), and how many
runs' best baseline changes. Timelines are not kept (`timeline=none`); the summaries are the simulator's.
Run: .venv/bin/python bench/mfu_flip.py [EXP.yaml ...] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testbed.errors import SpecError  # noqa: E402
from testbed.runs.simulated import run_experiment  # noqa: E402
from testbed.spec.load import load_experiment  # noqa: E402


@dataclass
class Flip:
    """One experiment's runs, typed (as shipped) and auto, paired by run_id."""

    name: str
    types_mfu: bool
    typed_s: list[float]
    auto_s: list[float]
    typed_mfu: list[float]
    auto_mfu: list[float]
    best_changed: int


def _summaries(path: Path, sets: list[str]) -> dict[str, dict]:
    points = load_experiment(path, sets=["timeline=none", *sets])
    return {r.summary["run_id"]: r.summary for r in run_experiment(points)}


def types_mfu(path: Path) -> bool:
    """Whether the spec (or its sweep) sets workload.mfu itself."""
    data = yaml.safe_load(path.read_text()) or {}
    return "mfu" in (data.get("workload") or {}) or any("mfu" in str(k) for k in (data.get("sweep") or {}))


def flip(path: Path, sets: list[str]) -> Flip:
    typed = _summaries(path, sets if types_mfu(path) else [*sets, "workload.mfu=0.5"])
    auto = _summaries(path, [*sets, "workload.mfu=auto"])
    ids = [i for i in typed if i in auto and typed[i]["iteration_s"] not in ("", None)]
    def col(runs: dict, key: str) -> list[float]:
        return [float(runs[i][key]) for i in ids]
    changed = sum(typed[i].get("best_baseline") != auto[i].get("best_baseline") for i in ids)
    return Flip(path.stem, types_mfu(path), col(typed, "iteration_s"), col(auto, "iteration_s"),
                col(typed, "mfu"), col(auto, "mfu"), changed)


def row(f: Flip) -> str:
    change = [a / t - 1 for a, t in zip(f.auto_s, f.typed_s, strict=True) if t > 0]
    pct = (f"{median(change):+.1%} ({min(change):+.1%} to {max(change):+.1%})" if change else "n/a")
    mfu_auto = f"{median(f.auto_mfu):.3g} ({min(f.auto_mfu):.3g}-{max(f.auto_mfu):.3g})"
    return (f"| {f.name} | {'yes' if f.types_mfu else 'no'} | {len(f.typed_s)} | {median(f.typed_s):.4g} | "
            f"{median(f.auto_s):.4g} | {pct} | {median(f.typed_mfu):.3g} | {mfu_auto} | {f.best_changed} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiments", nargs="*", type=Path, help="specs (default: experiments/*.yaml)")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="KEY=VALUE for both runs")
    a = ap.parse_args(argv)
    paths = a.experiments or sorted((ROOT / "experiments").glob("*.yaml"))
    print("| experiment | types mfu | runs | iteration_s typed (median) | auto (median) | change, median (range) "
          "| mfu typed | mfu auto, median (range) | best baseline changed |")
    print("|---|---|---|---|---|---|---|---|---|")
    skipped = []
    for p in paths:
        try:
            f = flip(p, a.sets)
        except SpecError as e:
            skipped.append(f"{p.stem}: {e}")
            continue
        if f.typed_s:
            print(row(f), flush=True)
        else:
            skipped.append(f"{p.stem}: no simulated training runs")
    for s in skipped:
        print(f"skipped {s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Atlas against each of its single-mechanism ablations and against pp-wan+greedy+mtcp+warmup, at every point
of `make claims`'s search (the cards that measure `atlas`: their sampled points and the climb from the best,
as `testbed claims` walks it) and of the paper-3dc latency x capacity sweep. Prints, per rival, the worst
ratio rival_s / atlas_s (at least 1.00: Atlas is never slower) and the point it occurs at; writes every
point to OUT/atlas_vs_ablations.csv.

Run: .venv/bin/python bench/atlas_vs_ablations.py [--out /tmp/atlas/ablations] [--jobs 2] [--quick]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed import claims
from testbed.results import write_csv
from testbed.runs.simulated import run_experiment
from testbed.spec.experiment import Experiment
from testbed.spec.load import experiment_data, load_experiment, validate

ROOT = Path(__file__).resolve().parent.parent
RIVALS = ["atlas-temporal", "atlas-stagger", "atlas-warmup", "atlas-greedy", "atlas-mtcp", "pp-wan+greedy+mtcp+warmup"]
CARDS = ["atlas-17x-vs-best", "atlas-17x-vs-deployed", "atlas-17x-vs-1tcp", "dtfm-4.8x"]
PAPER_SWEEP = ["topology.links.*.latency_ms=5,10,20,35,50,70", "topology.links.*.gbps=25,100,400,1600"]
HEADER = ("source", "point", "atlas_s", *RIVALS, "mechanisms")


def claims_points(jobs: int | None, quick: bool) -> list[tuple[str, str, dict[str, dict]]]:
    """(card, point, {scheduler: summary row}) at every point the cards' search visits."""
    out = []
    for name in CARDS:
        path = ROOT / "experiments" / "claims" / f"{name}.yaml"
        card = claims.load_card(path)
        scheds = dict.fromkeys([*experiment_data(path.parent / card.experiment)["schedulers"], "atlas", *RIVALS])
        sets = ["bubbletea.trace=synthetic", f"schedulers=[{', '.join(scheds)}]"]
        before = set(claims._CACHE)
        if quick:  # the first 8 sampled points, no climb
            exps = [(validate(Experiment, {**d, "timeline": "none"}, name), pt)
                    for d, pt in claims.card_points(card, path, sets, claims.space_combos(card)[:8])]
            claims._run_points([(e, pt) for e, pt in exps if claims.feasible(e)], jobs)
        else:
            claims.run_card(path, jobs, sets)
        for key in [k for k in claims._CACHE if k not in before]:
            rows = {r["scheduler"]: r for r in claims._CACHE[key]}
            out.append((name, _label(rows["atlas"]), rows))
    return out


def paper_points(jobs: int | None, quick: bool) -> list[tuple[str, str, dict[str, dict]]]:
    sweeps = ["topology.links.*.latency_ms=5,70", "topology.links.*.gbps=100,400"] if quick else PAPER_SWEEP
    points = load_experiment(ROOT / "experiments" / "paper-3dc.yaml",
                             ["timeline=none", f"schedulers=[{', '.join(['atlas', *RIVALS])}]"], sweeps)
    by: dict[str, dict[str, dict]] = {}
    for r in run_experiment(points, jobs):
        by.setdefault(r.summary["run_id"].split("-", 1)[0], {})[r.summary["scheduler"]] = r.summary
    return [("paper-3dc", _label(rows["atlas"]), rows) for rows in by.values()]


def _label(row: dict) -> str:
    return row["sweep"] or f"{row['model']} pp{row['pp']} dp{row['dp']}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("/tmp/atlas/ablations"))
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="8 points per card, no climb, 4 paper-3dc points")
    a = ap.parse_args()
    pts = claims_points(a.jobs, a.quick) + paper_points(a.jobs, a.quick)
    rows, worst = [], {r: (float("inf"), "") for r in RIVALS}
    for src, label, by in pts:
        atlas_s = float(by["atlas"]["iteration_s"])
        ratios = []
        for r in RIVALS:
            x = float(by[r]["iteration_s"]) / atlas_s
            ratios.append(round(x, 4))
            if x < worst[r][0]:
                worst[r] = (x, f"{src}: {label}")
        rows.append((src, label, atlas_s, *ratios, by["atlas"].get("mechanisms", "")))
    write_csv(a.out / "atlas_vs_ablations.csv", HEADER, rows)
    print(f"{len(pts)} points; worst rival_s / atlas_s (>= 1.00: Atlas at least as fast):")
    for r, (x, where) in worst.items():
        print(f"  {r:28s} {x:6.3f}  at {where}")
    print(f"wrote {a.out / 'atlas_vs_ablations.csv'}")


if __name__ == "__main__":
    main()

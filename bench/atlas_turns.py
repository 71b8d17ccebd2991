"""Atlas's turns on the emulated WAN, seen packet by packet: the emu-3dc plan (pp-wan+mtcp+temporal)
with the replicas' start offsets removed, so their transfers collide, run with the sidecar and
without it (the link's FIFO), every WAN link captured. Writes OUT/flows.csv and draws
OUT/figures/wan_flows_{sidecar,fifo}[_zoom].png (the zoom: the 200 ms with most contention).

Needs root. Run: sudo .venv/bin/python bench/atlas_turns.py [--out results/atlas-turns] [--iterations 3]
tests/integration/test_atlas_turns.py asserts the difference from the same kind of run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.analysis.flows import FLOWS_HEADER
from testbed.emu.build import down, up
from testbed.emu.train import run_training
from testbed.figures.draw import draw_all
from testbed.plan.build import resolve_dp
from testbed.results import write_csv
from testbed.sim.choose import build_plan
from testbed.spec.load import load_experiment

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("results/atlas-turns"))
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--prefix", default="gdtbl9")
    a = ap.parse_args()
    exp = load_experiment(ROOT / "experiments" / "emu-3dc.yaml", [f"iterations={a.iterations}"])[0][0]
    k = exp.emulation.scale
    emu = up(exp.topology, prefix=a.prefix, scale=k)
    rows: list[tuple] = []
    try:
        for name, temporal in (("sidecar", True), ("fifo", False)):
            sched = "pp-wan+mtcp+temporal" if temporal else "pp-wan+mtcp"  # without: no sidecar, the link's FIFO
            plan = build_plan(exp, sched, run_id=name, dp=resolve_dp(exp), built=emu.net)
            plan.replica_offset_s = [0.0] * plan.dp
            run = run_training(plan, emu, a.iterations, capture=True)
            print(f"{name}: {run.capture_summary}")
            rows += run.captured
    finally:
        down(emu)
    write_csv(a.out / "flows.csv", FLOWS_HEADER, rows)
    for p in draw_all(a.out, a.out / "figures"):
        print(f"wrote {p}")


if __name__ == "__main__":
    main()

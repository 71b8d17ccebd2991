"""How much the simulator's Atlas iterations depend on the sidecar's reaction (sim/executor.py
SIDECAR_REACTION_S): re-simulates the Atlas cases of `bench/fidelity.py` outputs at other reactions and prints the
error against the emulated iterations those runs measured, per dp. No emulation, no root: the cases are drawn
again from each row's seed, as fidelity.py drew them.

Run: .venv/bin/python bench/reaction_sensitivity.py RUN1/fidelity.csv [RUN2/fidelity.csv ...]
     [--reactions-ms 0.5,1.05,2]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import fidelity  # noqa: E402  (the bench's own case draw)

import testbed.sim.executor as executor  # noqa: E402
from testbed.emu.scale import auto_scale  # noqa: E402
from testbed.plan.build import resolve_dp  # noqa: E402
from testbed.plan.network import lower_network  # noqa: E402
from testbed.sim.choose import build_plan  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csvs", nargs="+", type=Path)
    ap.add_argument("--reactions-ms", default="0.5,1.05,2")
    args = ap.parse_args(argv)
    reactions = [float(x) / 1e3 for x in args.reactions_ms.split(",")]
    rows = [r for p in args.csvs for r in csv.DictReader(p.open()) if r["scheduler"] == "atlas"]
    if not rows:
        print("no atlas rows in the given fidelity.csv files", file=sys.stderr)
        return 1
    by_seed: dict[int, dict[int, dict]] = {}
    for r in rows:
        by_seed.setdefault(int(r["seed"]), {})[int(r["topology"])] = r
    results = []  # (dp, emulated s, simulated s per reaction)
    for seed, runs in by_seed.items():
        draw = next(iter(runs.values())).get("draw") or "narrow"  # rows before the wide draw have no draw column
        for case in fidelity.cases(seed, max(runs) + 1, None, 5, ("atlas",), draw):
            if case.index not in runs:
                continue
            exp = case.experiment
            built = lower_network(exp.topology, exp.emulation.scale or auto_scale(exp.topology))
            sims = []
            for reaction in reactions:
                executor.SIDECAR_REACTION_S = reaction
                sims.append(executor.simulate(build_plan(exp, "atlas", run_id="r", dp=resolve_dp(exp), built=built))[0]
                            .iteration_s[-1])
            results.append((int(case.params["dp"]), float(runs[case.index]["emu_s"]), sims))
    print(f"{len(results)} atlas runs; median signed error (sim - emu) / emu by dp, and the largest change of a "
          f"simulated iteration from the first reaction")
    for k, reaction in enumerate(reactions):
        per_dp = {dp: statistics.median((s[k] - e) / e for d, e, s in results if d == dp)
                  for dp in sorted({d for d, _, _ in results})}
        moved = max(abs(s[k] - s[0]) / s[0] for _, _, s in results)
        cells = "  ".join(f"dp {dp}: {v:+.2%}" for dp, v in per_dp.items())
        print(f"reaction {reaction * 1e3:5.2f} ms  {cells}  largest change {moved:.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The simulator's timing-noise model against the emulator: re-simulate a `bench/fidelity.py` run's cases with
every compute op's and transfer's time drawn from the simulator's noise (testbed/sim/realised.py: lognormal, cv
as measured on the emulated runs, docs/bubbletea.md) and compare, case by case, with the emulated times that run
recorded. Asks whether the replicas' drift the emulator shows (docs/fidelity.md, Limits) is what noise does to a
simulated pipeline. Simulation only: no root, no emulation.

Run: .venv/bin/python bench/fidelity_noise.py --seed S --csv DIR/fidelity.csv [--draws 5] [--cv 0.06 0.1]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from statistics import mean, median

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fidelity  # noqa: E402  (bench/fidelity.py: the same cases from the same seed)

from testbed.plan.build import resolve_dp  # noqa: E402
from testbed.plan.network import lower_network  # noqa: E402
from testbed.sim.choose import build_plan  # noqa: E402
from testbed.sim.executor import simulate  # noqa: E402
from testbed.sim.realised import Jitter, realise  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--csv", type=Path, required=True, help="fidelity.csv of a bench/fidelity.py run of that seed")
    ap.add_argument("--draws", type=int, default=5, help="noise draws per case (their mean is the prediction)")
    ap.add_argument("--cv", type=float, nargs=2, default=(0.06, 0.1), metavar=("COMPUTE", "WAN"))
    args = ap.parse_args()
    rows = list(csv.DictReader(args.csv.open()))
    emu = {(int(r["topology"]), r["scheduler"]): float(r["emu_s"]) for r in rows}
    n = 1 + max(t for t, _ in emu)
    errs: dict[str, list[tuple[float, float]]] = {}
    print("topology scheduler | simulated: exact, with noise | emulated | error: exact, with noise")
    draw = rows[0].get("draw") or "narrow"  # rows written before the wide draw have no draw column
    for case in fidelity.cases(args.seed, n, None, 3, fidelity.SCHEDULERS, draw):
        exp = case.experiment
        built = lower_network(exp.topology, exp.emulation.scale)
        dp = resolve_dp(exp)
        for sched in exp.schedulers:
            if (case.index, sched) not in emu:
                continue
            plan = build_plan(exp, sched, run_id=f"p{case.index:02d}-{sched}", dp=dp, built=built)
            exact = simulate(plan)[0].iteration_s[0]
            noisy = mean(realise(plan, Jitter(1000 + d, *args.cv)).timeline.iteration_s[0] for d in range(args.draws))
            e = emu[(case.index, sched)]
            errs.setdefault(sched, []).append(((exact - e) / e, (noisy - e) / e))
            print(f"{case.index} {sched} | {exact:.4f}, {noisy:.4f} | {e:.4f} | "
                  f"{(exact - e) / e:+.1%}, {(noisy - e) / e:+.1%}")
    for sched, v in errs.items():
        worst = [max(v, key=lambda x, i=i: abs(x[i]))[i] for i in (0, 1)]
        print(f"{sched}: median abs. error exact {median(abs(x) for x, _ in v):.1%}, with noise "
              f"{median(abs(y) for _, y in v):.1%}; worst {worst[0]:+.1%}, {worst[1]:+.1%}")


if __name__ == "__main__":
    main()

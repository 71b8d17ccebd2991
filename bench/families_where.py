"""Which family is fastest where: paper-3dc and dtfm-8region over a latency x capacity grid, every family.

For each experiment and grid point (every WAN link set to the latency and capacity) each family's scheduler runs
on the experiment's own layout; a family's number is its strongest scheduler's (the pipeline family: Atlas or
pp-wan + multi-TCP + warm-up). DiLoCo's periods are timed from two short periods (testbed/runs/period.py, exact
to rounding), so DiLoCo's 500-step period on 8 regions is in reach. Writes one CSV per experiment and
docs/img/families-where.png (testbed/figures/families.py).

    .venv/bin/python bench/families_where.py [--out results/families-where] [--figure docs/img/families-where.png]
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from testbed.costs.models import resolve_model
from testbed.errors import SpecError
from testbed.figures.families import draw_where
from testbed.plan.build import resolve_dp
from testbed.results import write_csv
from testbed.runs.period import timed
from testbed.spec.load import load_experiment

GRIDS = {  # experiment -> (one-way latencies in ms, capacities in Gbit/s), every WAN link set to each
    "experiments/paper-3dc.yaml": ((5, 20, 70), (100, 400, 1600)),
    "experiments/dtfm-8region.yaml": ((10, 35, 70), (0.5, 1, 10)),
}
FAMILY_OF = {"atlas": "pipeline", "pp-wan+mtcp+warmup": "pipeline", "dp-wan": "dp-wan", "diloco": "diloco",
             "streaming-diloco": "streaming-diloco"}
HEADER = ("experiment", "latency_ms", "gbps", "scheduler", "family", "iteration_s", "tokens_per_s",
          "token_efficiency", "effective_tokens_per_s", "status")


def one(args: tuple[str, float, float, str]) -> tuple:
    path, lat, gbps, sched = args
    (exp, _), = load_experiment(path, [f"schedulers=[{sched}]", "timeline=none"],
                                [f"topology.links.*.latency_ms={lat}", f"topology.links.*.gbps={gbps}"])
    w = exp.workload
    tokens = w.global_batch * resolve_model(w.model, w.seq_len).seq_len
    name = Path(path).stem
    try:
        it, _, eff = timed(exp, sched, resolve_dp(exp))
    except SpecError as e:
        return (name, lat, gbps, sched, FAMILY_OF[sched], "", "", "", "", f"infeasible: {e}")
    return (name, lat, gbps, sched, FAMILY_OF[sched], round(it, 6), round(tokens / it, 3), eff,
            round(tokens / it * eff, 3), "ok")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("results/families-where"))
    ap.add_argument("--figure", type=Path, default=Path("docs/img/families-where.png"))
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    csvs = []
    for path, (lats, caps) in GRIDS.items():
        tasks = [(path, lat, g, s) for lat in lats for g in caps for s in FAMILY_OF]
        with ProcessPoolExecutor(a.jobs) as pool:
            rows = list(pool.map(one, tasks))
        csv = a.out / f"{Path(path).stem}.csv"
        write_csv(csv, HEADER, rows)
        csvs.append(csv)
        print(f"wrote {csv}")
    print(f"wrote {draw_where(csvs, a.figure)}")


if __name__ == "__main__":
    main()

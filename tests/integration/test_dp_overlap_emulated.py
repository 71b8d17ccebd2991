"""Emulated workers run dp-wan's bucketed collectives (ReduceScatter, AllGather, Await) over the real emulated
WAN, next to the simulator's prediction of the same programs."""

from __future__ import annotations

import csv
from collections import defaultdict

from testbed.plan.lower import lower
from testbed.program import ReduceScatter
from testbed.sim.choose import build_plan
from testbed.spec.load import load_experiment
from tests.conftest import ROOT
from tests.integration.conftest import cli, snapshot_of

EXP = str(ROOT / "experiments" / "emu-3dc.yaml")
# one stage, two replicas in each of three DCs (a hierarchical reduce-scatter), a two-layer model: seconds a run
SETS = ["workload.pp=1", "workload.dp=6", "workload.global_batch=6", "workload.model.layers=2", "iterations=2",
        "schedulers=[dp-wan]", "emulation.prefix=gdtb11"]


def rows(path) -> list[dict]:
    return list(csv.DictReader(path.read_text().splitlines()))


def test_emulated_workers_run_the_bucketed_collectives_as_the_simulator_does(tmp_path):
    before = snapshot_of("gdtb11")
    args = [x for s in SETS for x in ("--set", s)]
    r = cli("experiment", "run", EXP, "--out", str(tmp_path), *args)
    assert r.returncode == 0, r.stderr
    plan = build_plan(load_experiment(EXP, sets=SETS)[0][0], "dp-wan")
    buckets = sum(isinstance(st, ReduceScatter) for st in lower(plan)["s0r0"].steps)
    assert buckets > 1
    per: dict[tuple, list[dict]] = defaultdict(list)
    for x in rows(tmp_path / "timeline.csv"):
        if x["source"] == "emu":
            per[(x["iteration"], x["gpu"])].append(x)
    assert {g for _it, g in per} == {f"s0r{r}" for r in range(plan.dp)}
    for key, ivs in per.items():
        rs = sorted((x for x in ivs if x["kind"] == "reduce_scatter"), key=lambda x: float(x["start_s"]))
        assert sorted(int(x["microbatch"]) for x in rs) == list(range(buckets)), key
        assert sum(x["kind"] == "all_gather" for x in ivs) == buckets, key
        assert all(float(a["end_s"]) <= float(b["start_s"]) + 1e-3 for a, b in zip(rs, rs[1:], strict=False)), key
        opt = next(x for x in ivs if x["kind"] == "optimizer")
        assert float(opt["start_s"]) >= float(rs[-1]["end_s"]) - 1e-3, key  # steps on the reduced gradients
    # measured -1.7 to -2.6 % (3 runs, load 12-14 on 2 cores; docs/families.md); wide here as the other emulated
    # runs' bound: CI VMs are noisy
    v = next(x for x in rows(tmp_path / "validation.csv") if x["metric"] == "iteration_s")
    assert abs(float(v["rel_error"])) < 0.35, v
    assert snapshot_of("gdtb11") == before

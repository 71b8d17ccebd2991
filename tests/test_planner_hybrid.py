"""The planner's hybrid family: a pipeline over a pair of DCs, whole pipelines in the others, dp-wan across."""

from __future__ import annotations

import pytest

from testbed.costs.models import resolve_model
from testbed.plan.estimate_dp import FamilyEstimator
from testbed.plan.groups import stage_counts
from testbed.runs.families import hybrid_layouts, pairings
from testbed.runs.period import timed
from testbed.runs.select import MICROBATCHES, group_spec, plan_rows, search
from testbed.sim.choose import build_plan
from testbed.spec.mechanisms import parse_scheduler
from tests.test_planner import topo
from tests.test_planner_families import experiment


def test_pairings_cut_a_set_into_groups_of_one_or_two_with_a_pair():
    for dcs, n in ((("a", "b", "c"), 6), (("a", "b", "c", "d"), 24)):
        ways = pairings(dcs)
        assert len(ways) == n and len({tuple(w) for w in ways}) == n
        for w in ways:
            assert sorted(d for g in w for d in g) == sorted(dcs)
            assert len(w) >= 2 and max(map(len, w)) == 2
    assert pairings(("a", "b")) == []  # one pair alone is one group: the pipeline family's


def test_hybrid_layouts_place_their_replicas_as_the_plan_does():
    t = topo([("a", "H100", 8), ("b", "H100", 8), ("c", "A100", 8)])
    exp = experiment(t, global_batch=8)
    found = [lay for lay, _, _ in hybrid_layouts(exp, [1], [2, 4], [1], MICROBATCHES) if lay is not None]
    assert found and {lay.groups for lay in found} == {(2, 1), (1, 2)}
    for lay in found:
        w = exp.workload.model_copy(update={"pp": lay.pp, "dp": lay.dp, "groups": group_spec(lay)})
        plan = build_plan(exp.model_copy(update={"workload": w}), "dp-wan", dp=lay.dp)
        rows = [tuple(r) for r in plan.stage_dc]
        for g, n in zip(lay.group_dcs(), lay.counts, strict=True):
            row = tuple(d for d, c in zip(g, stage_counts(len(g), lay.pp), strict=True) for _ in range(c))
            assert rows.count(row) == n, (lay, rows)
        assert sum(lay.counts) == lay.dp == len(rows)


def test_a_hybrid_estimate_grows_as_the_link_across_groups_thins():
    """Only the stages' rings across the groups use the links to the lone DC: thinning them costs time."""
    lay_of = {}
    for gbps in (100.0, 1.0):
        t = topo([("a", "H100", 8), ("b", "H100", 8), ("c", "H100", 8)], gbps=gbps)
        exp = experiment(t, global_batch=8)
        est = FamilyEstimator(exp, resolve_model(exp.workload.model, exp.workload.seq_len), parse_scheduler("dp-wan"))
        lay = next(lay for lay, _, _ in hybrid_layouts(exp, [1], [2], [1], MICROBATCHES)
                   if lay is not None and lay.groups == (2, 1))
        lay_of[gbps] = (est(lay).iteration_s, est.hybrid_wan_s(lay))
    assert lay_of[1.0][1] > lay_of[100.0][1] > 0
    assert lay_of[1.0][0] > lay_of[100.0][0]


def test_the_planner_searches_hybrids_and_its_answer_reproduces():
    t = topo([("a", "H100", 8), ("b", "H100", 8), ("c", "H100", 8)], gbps=10.0)
    exp = experiment(t, global_batch=8)
    res = search(exp, "atlas", 1, tps=[1], pps=[2], microbatch_sizes=[1], jobs=1, families=["hybrid"])
    assert [s.dcs for s in res.sets] == ["a|b|c"]
    best = res.best
    assert best is not None and best.family == "hybrid" and best.scheduler == "dp-wan" and best.layout.groups
    lay = best.layout
    w = exp.workload.model_copy(update={"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "microbatch": lay.microbatch,
                                        "groups": group_spec(lay)})
    it, _, _ = timed(exp.model_copy(update={"workload": w}), "dp-wan", lay.dp)
    assert it == pytest.approx(best.iteration_s, rel=1e-12)
    rows = [r for r in plan_rows(res) if r[-1].startswith("best")]
    assert rows and " | " in rows[0][3] and ">" in rows[0][5]  # order "x > y | z", replicas per group "x>y:n"

"""The planner across families: data-parallel layouts, replicas per DC, the families' estimate, the search by
effective tokens/s, a sweep that keeps earlier plans in play, and the one-page answer."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.answer import write_answer
from testbed.costs.models import resolve_model
from testbed.errors import SpecError
from testbed.plan.estimate import Layout
from testbed.plan.estimate_dp import FamilyEstimator
from testbed.results import write_csv
from testbed.runs.families import FAMILIES, dc_sets, dp_layouts, parse_families, split_replicas
from testbed.runs.plan_sweep import search_points
from testbed.runs.select import PLAN_HEADER, plan_rows, search
from testbed.sim.choose import build_plan
from testbed.spec.experiment import Experiment
from testbed.spec.mechanisms import parse_scheduler
from testbed.spec.topology import Topology
from tests.test_planner import SMALL, topo


def experiment(t: Topology, **workload) -> Experiment:
    return Experiment(topology=t, schedulers=["atlas"],
                      workload={"model": SMALL, "global_batch": 16, "tp": 1, "pp": 2,
                                "diloco": {"inner_steps": 4}, **workload})


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=5), st.integers(1, 100))
def test_split_replicas_fills_each_dc_within_its_room(fits, dp):
    got = split_replicas(dp, fits)
    if dp < len(fits) or dp > sum(fits) or min(fits) < 1:
        assert got is None
        return
    assert got is not None and sum(got) == dp
    assert all(1 <= c <= f for c, f in zip(got, fits, strict=True))
    # in proportion to the room: no DC holds two more than its share, rounding aside
    assert all(abs(c - dp * f / sum(fits)) < 2 for c, f in zip(got, fits, strict=True))


def test_dp_layouts_hold_whole_replicas_on_two_dcs_or_more():
    t = topo([("a", "H100", 8), ("b", "H100", 4), ("c", "H100", 8)])
    exp = experiment(t)
    found = dp_layouts(exp, None, None, None, (1, 2))
    assert {k[0] for _, k, _ in found} == set(dc_sets(t)) and all(len(k[0]) >= 2 for _, k, _ in found)
    placed = [lay for lay, _, _ in found if lay is not None]
    assert placed
    for lay in placed:
        assert sum(lay.counts) == lay.dp and min(lay.counts) >= 1
        assert (16 // lay.microbatch) % lay.dp == 0
        for d, n in zip(lay.order, lay.counts, strict=True):
            assert n * lay.tp * lay.pp <= t.dc(d).gpus


def test_dc_sets_need_every_pair_linked():
    t = Topology(dcs=[{"name": n, "gpu": "H100", "gpus": 8} for n in "abc"],
                 links=[{"between": ["a", "b"], "gbps": 10, "latency_ms": 5},
                        {"between": ["b", "c"], "gbps": 10, "latency_ms": 5}])
    assert dc_sets(t) == [("a", "b"), ("b", "c")]


def test_replicas_per_dc_pins_dp_wan_placement_and_names_the_field():
    t = topo([("a", "H100", 16), ("b", "H100", 16)])
    exp = experiment(t, dp=4, replicas_per_dc={"b": 3, "a": 1})
    plan = build_plan(exp, "dp-wan")
    assert [row[0] for row in plan.stage_dc] == ["b", "b", "b", "a"]
    for bad, dp, words in (({"b": 14, "a": 2}, 16, "fits 8"), ({"b": 2, "a": 1}, 4, "dp=4"),
                           ({"x": 3, "a": 1}, 4, "unknown DC")):
        with pytest.raises(SpecError, match=words) as e:
            build_plan(experiment(t, dp=dp, replicas_per_dc=bad), "dp-wan")
        assert e.value.field == "workload.replicas_per_dc"


def test_family_estimate_adds_the_wan_ring_to_the_inner_step():
    """dp-wan pays the gradients' ring every step, DiLoCo its outer sync once per H, and a thinner WAN costs
    dp-wan more than DiLoCo."""
    lay = Layout(("a", "b"), (2, 2), 1, 2, 4, 1)
    got = {}
    for gbps in (1.0, 100.0):
        exp = experiment(topo([("a", "H100", 8), ("b", "H100", 8)], gbps=gbps))
        model = resolve_model(exp.workload.model)
        inner = FamilyEstimator(exp, model, parse_scheduler("dp-wan")).inner(Layout(("a",), (2,), 1, 2, 4, 1))
        for s in ("dp-wan", "diloco", "streaming-diloco"):
            got[(s, gbps)] = FamilyEstimator(exp, model, parse_scheduler(s))(lay).iteration_s - inner.iteration_s
    params_bytes = (model.layers * model.layer_params() + 2 * model.embedding_params()) * 2
    assert got[("dp-wan", 1.0)] >= params_bytes / (1e9 / 8)  # 2 (D - 1) / D = 1 for two DCs
    assert 0 < got[("diloco", 1.0)] < got[("dp-wan", 1.0)]
    assert got[("streaming-diloco", 1.0)] < got[("diloco", 1.0)]  # a quarter of the bits, partly hidden
    assert got[("dp-wan", 1.0)] - got[("dp-wan", 100.0)] > got[("diloco", 1.0)] - got[("diloco", 100.0)]


def test_search_by_family_ranks_every_family_and_dc_set_by_effective_tokens():
    t = topo([("a", "H100", 8), ("b", "H100", 8)], gbps=10.0)
    exp = experiment(t, token_efficiency=None)
    res = search(exp, "atlas", 1, jobs=1, families=list(FAMILIES))
    seen = {(s.family, s.dcs) for s in res.sets}
    assert {("pipeline", "a"), ("pipeline", "b"), ("pipeline", "a|b")} <= seen
    assert {(f, "a|b") for f in ("dp-wan", "diloco", "streaming-diloco")} <= seen
    bests = [s.best for s in res.sets if s.best is not None]
    assert res.best is not None and res.best.status == "best"
    assert res.best.effective_tokens_per_s == max(c.effective_tokens_per_s for c in bests)
    for c in bests:
        assert c.scheduler == (FAMILIES[c.family] if c.family != "pipeline" else "atlas")
        assert c.effective_tokens_per_s == pytest.approx(c.tokens_per_s * c.token_efficiency)
    rows = list(plan_rows(res))
    assert all(len(r) == len(PLAN_HEADER) for r in rows)
    assert {r[0] for r in rows} == set(FAMILIES) - {"hybrid"}  # a hybrid needs three DCs (tests/test_planner_hybrid.py)


def test_token_efficiency_scales_the_ranking():
    """A family's efficiency is an input: halving DiLoCo's halves its effective tokens/s, not its time."""
    t = topo([("a", "H100", 8), ("b", "H100", 8)], gbps=10.0)
    full = search(experiment(t), "atlas", 1, jobs=1, families=["diloco"])
    half = search(experiment(t, token_efficiency=0.5), "atlas", 1, jobs=1, families=["diloco"])
    a, b = full.sets[0].best, half.sets[0].best
    assert a.iteration_s == b.iteration_s and b.effective_tokens_per_s == pytest.approx(a.effective_tokens_per_s / 2)


def test_a_sweep_keeps_earlier_plans_in_play():
    """Every point simulates the best layouts of the points before it, so a capacity sweep's best never falls
    as long as each layout runs no slower with more capacity."""
    t = topo([("a", "H100", 8), ("b", "H100", 8), ("c", "A100", 8)])
    points = [(experiment(t.model_copy(update={"links": [lk.model_copy(update={"gbps": g}) for lk in t.links]})),
               {"topology.links.*.gbps": g}) for g in (1.0, 10.0, 100.0)]
    found = search_points(points, "atlas", 1, None, None, None, 1, ["pipeline", "diloco"])
    best = [res.best.effective_tokens_per_s for _, res in found]
    assert best == sorted(best)
    first = {(s.family, s.best.key()) for s in found[0][1].sets if s.best is not None}
    later = {(c.family, c.key()) for c in found[1][1].candidates if c.iteration_s is not None}
    assert first <= later


def test_parse_families_names_the_option():
    assert parse_families(None) == list(FAMILIES)
    with pytest.raises(SpecError, match="unknown family") as e:
        parse_families("pipeline,zero")
    assert e.value.field == "--families"


def test_answer_page_is_self_contained_with_every_family(tmp_path):
    t = topo([("a", "H100", 8), ("b", "H100", 8), ("c", "H100", 8)], gbps=10.0)  # three: the hybrid family too
    points = [(experiment(t), {"workload.global_batch": b}) for b in (16, 32)]
    found = search_points(points, "atlas", 1, None, None, None, 1, list(FAMILIES))
    rows = [(";".join(f"{k}={v}" for k, v in p.items()),) + tuple(r) for p, res in found for r in plan_rows(res)]
    csv = tmp_path / "plan.csv"
    write_csv(csv, ("sweep",) + PLAN_HEADER, rows)
    page = write_answer(csv, tmp_path, "small").read_text()
    assert "data:image/png;base64," in page and "<script" not in page and "src=\"http" not in page
    for f in (*FAMILIES, "one site"):
        assert f"<td>{f}</td>" in page
    assert page.count("<h2>workload.global_batch=") == 2 and "Sensitivity" in page
    assert set(pd.read_csv(csv)["family"]) == set(FAMILIES)


@pytest.mark.parametrize(("scheduler", "diloco"), [("diloco", {"inner_steps": 9}),
                                                    ("streaming-diloco", {"inner_steps": 12, "fragments": 2}),
                                                    ("streaming-diloco", {"inner_steps": 2})])
def test_the_planner_times_a_long_sync_period_from_two_short_ones(scheduler, diloco):
    """A period is linear in H (each fragment's sync overlaps the same tau steps): the planner's two short
    periods give what simulating the whole period gives."""
    from testbed.runs.select import _simulate
    from testbed.sim.executor import simulate

    t = topo([("a", "H100", 8), ("b", "H100", 8), ("c", "H100", 8)], gbps=0.5, latency_ms=20)
    exp = experiment(t, diloco=diloco, dp=3, global_batch=12)
    lay = Layout(("a", "b", "c"), (1, 1, 1), 1, 2, 3, 1)
    got, layers, eff, problem = _simulate((exp, scheduler, lay, False))
    plan = build_plan(exp, scheduler, dp=3, order=list(lay.order), counts=list(lay.counts))
    full = simulate(plan)[0].iteration_s[0] / plan.steps_per_program
    assert problem == "" and layers == plan.layers and eff == plan.token_efficiency
    assert got == pytest.approx(full, rel=1e-9)

"""Claim cards: metrics, filters, verdicts, and a tiny card run end to end through the simulator."""

from __future__ import annotations

import csv

import pytest

from testbed.claims import (
    ClaimCard,
    card_points,
    family,
    load_card,
    one_site,
    one_site_experiment,
    point_value,
    run_claims,
    verdict,
)
from testbed.errors import SpecError
from testbed.spec.load import load_experiment
from tests.conftest import ROOT

CARD = {"name": "c", "claim": "x", "source": "s", "published": 2.0, "unit": "x", "accept": [1.5, 3.0],
        "assumptions": ["a"], "experiment": "../tiny-3dc.yaml",
        "metric": {"kind": "speedup", "scheduler": "atlas", "baseline": "best"}}
ROWS = [{"scheduler": "pp-wan", "iteration_s": 4.0, "gpu_util": 0.2, "train_slowdown": ""},
        {"scheduler": "pp-wan+mtcp", "iteration_s": 3.0, "gpu_util": 0.3, "train_slowdown": ""},
        {"scheduler": "pp-wan+temporal", "iteration_s": 1.0, "gpu_util": 0.9, "train_slowdown": ""},
        {"scheduler": "atlas", "iteration_s": 1.5, "gpu_util": 0.6, "train_slowdown": 0.01}]


def card(**kw) -> ClaimCard:
    return ClaimCard.model_validate({**CARD, **kw})


def test_best_baseline_is_the_fastest_scheduler_that_neither_is_atlas_nor_takes_turns():
    value, row, base, kept = point_value(card(), ROWS)
    assert base["scheduler"] == "pp-wan+mtcp" and value == pytest.approx(2.0) and kept


def test_the_best_baseline_is_taken_over_every_family_per_token_of_synchronous_training():
    slow = {"scheduler": "diloco", "iteration_s": 1.2, "token_efficiency": 0.3}  # 4.0 s per synchronous step
    assert point_value(card(), [*ROWS, slow])[2]["scheduler"] == "pp-wan+mtcp"
    fast = {"scheduler": "streaming-diloco", "iteration_s": 1.2, "token_efficiency": 0.6}  # 2.0 s
    value, _, base, _ = point_value(card(), [*ROWS, slow, fast])
    assert base["scheduler"] == "streaming-diloco" and value == pytest.approx(2.0 / 1.5)


def test_each_baseline_is_named_with_its_family():
    assert family("pp-wan+greedy+mtcp+warmup") == family("pp-1tcp") == "pipeline across DCs"
    assert family("dp-wan") == family("dp-wan-overlap") == "DP across DCs"
    assert (family("diloco"), family("streaming-diloco")) == ("DiLoCo", "Streaming DiLoCo")
    assert family("atlas-temporal") == "pipeline across DCs (Atlas)"


def test_gain_value_and_where():
    value, *_ , kept = point_value(card(metric={"kind": "gain", "scheduler": "atlas", "baseline": "pp-wan",
                                                "column": "gpu_util"}, where=["train_slowdown < 0.02"]), ROWS)
    assert value == pytest.approx(2.0) and kept
    *_, kept = point_value(card(where=["train_slowdown < 0.005"]), ROWS)
    assert not kept
    value, *_ = point_value(card(metric={"kind": "value", "scheduler": "atlas", "column": "gpu_util"}), ROWS)
    assert value == 0.6


def test_verdicts():
    assert verdict(card(), 2.5) == "reproduced"
    assert verdict(card(), 1.0) == "not reproduced"
    assert verdict(card(), None) == "not reproduced"
    assert verdict(card(regime="different"), 2.5) == "different regime"


def test_bad_cards_name_the_field():
    with pytest.raises(ValueError, match="accept"):
        card(accept=[3, 1])
    with pytest.raises(ValueError, match="where"):
        card(where=["gpu_util ~ 3"])
    with pytest.raises(SpecError, match="metric.scheduler"):
        point_value(card(metric={"kind": "speedup", "scheduler": "nope"}), ROWS)
    # a scheduler the experiment has that could not run at this point: its row's status is the error, not "missing"
    failed = [r for r in ROWS if r["scheduler"] != "atlas"] + [
        {"scheduler": "atlas", "iteration_s": "", "status": "infeasible: bubbletea.trace: x.csv not found"}]
    with pytest.raises(SpecError, match="could not run: infeasible: bubbletea.trace"):
        point_value(card(), failed)


def test_space_sampling_is_seeded_and_span_dcs_sizes_the_dcs(tmp_path):
    path = tmp_path / "experiments" / "claims" / "c.yaml"
    path.parent.mkdir(parents=True)
    (tmp_path / "experiments" / "tiny-3dc.yaml").write_text((ROOT / "experiments" / "tiny-3dc.yaml").read_text()
                                                            .replace("../topologies", str(ROOT / "topologies")))
    c = card(space={"topology.links.*.latency_ms": [1, 2, 3, 4, 5], "workload.pp": [3, 6]}, samples=4, seed=3,
             span_dcs=True)
    a, b = card_points(c, path), card_points(c, path)
    assert [p for _, p in a] == [p for _, p in b] and len(a) == 4
    for d, p in a:
        assert {dc["gpus"] for dc in d["topology"]["dcs"]} == {-(-p["workload.pp"] // 3) * 1 * 2}  # tp 1, dp 2


def test_a_card_runs_end_to_end(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(f"""
name: tiny
claim: tiny claim
source: nobody
published: 1.2
unit: x
accept: [1.0, 100]
assumptions: [tiny]
experiment: {ROOT / "experiments" / "tiny-3dc.yaml"}
set: ["schedulers=[pp-wan,pp-wan+mtcp,atlas]"]
space: {{topology.links.*.latency_ms: [5, 40]}}
metric: {{kind: speedup, scheduler: atlas, baseline: best}}
""")
    assert load_card(path).name == "tiny"
    paths = run_claims([path], tmp_path / "out", jobs=1)
    rows = list(csv.DictReader(paths[0].read_text().splitlines()))
    assert len(rows) == 1 and rows[0]["verdict"] in ("reproduced", "not reproduced") and rows[0]["ours"]
    points = list(csv.DictReader(paths[1].read_text().splitlines()))
    assert len(points) == 2 and {p["baseline"] for p in points} <= {"pp-wan", "pp-wan+mtcp"}
    assert paths[2].stat().st_size > 0


def test_efficiency_is_the_schedulers_time_on_one_dc_over_its_time_across_dcs():
    c = card(metric={"kind": "efficiency", "scheduler": "atlas"})
    one = [{"scheduler": "atlas", "iteration_s": 1.2}, {"scheduler": "pp-wan", "iteration_s": 0.1}]
    value, row, base, _ = point_value(c, ROWS, one)
    assert value == pytest.approx(1.2 / 1.5) and row["scheduler"] == "atlas"
    assert base["scheduler"] == "atlas in one DC" and family(base["scheduler"]) == "one DC"
    with pytest.raises(SpecError, match="one-DC run"):
        point_value(c, ROWS)


def test_one_site_holds_the_same_gpus_in_one_dc_and_refuses_unlike_dcs():
    exp = load_experiment(ROOT / "experiments" / "tiny-3dc.yaml")[0][0]
    topo = exp.topology
    one = one_site(topo)
    assert len(one.dcs) == 1 and not one.links and one.dcs[0].name == topo.dcs[0].name
    assert one.dcs[0].gpus == sum(d.gpus for d in topo.dcs) and one.dcs[0].gpu == topo.dcs[0].gpu
    pinned = exp.model_copy(update={"workload": exp.workload.model_copy(update={"replicas_per_dc": {
        topo.dcs[0].name: 1, topo.dcs[1].name: 1}})})
    moved = one_site_experiment(pinned, "dp-wan")
    assert moved.schedulers == ["dp-wan"] and moved.workload.replicas_per_dc == {topo.dcs[0].name: 2}
    unlike = topo.model_copy(update={"dcs": [topo.dcs[0], topo.dcs[1].model_copy(update={"gpu": "A100"})]})
    with pytest.raises(SpecError, match=r"topology\.dcs\[1\].*gpu A100 vs H100"):
        one_site(unlike)


def test_an_efficiency_card_simulates_each_point_on_one_dc_too(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(f"""
name: tiny-eff
claim: tiny claim
source: nobody
published: 0.9
unit: fraction
accept: [0.5, 1.0]
assumptions: [tiny]
experiment: {ROOT / "experiments" / "tiny-3dc.yaml"}
set: ["schedulers=[dp-wan]", "workload.replicas_per_dc={{useast: 1, uswest: 1}}"]
space: {{topology.links.*.latency_ms: [5, 80]}}
metric: {{kind: efficiency, scheduler: dp-wan}}
""")
    paths = run_claims([path], tmp_path / "out", jobs=1)
    points = list(csv.DictReader(paths[1].read_text().splitlines()))
    assert [p["baseline"] for p in points] == ["dp-wan in one DC"] * 2
    assert points[0]["baseline_s"] == points[1]["baseline_s"]  # the one-DC run has no WAN to change
    for p in points:
        assert float(p["value"]) == pytest.approx(float(p["baseline_s"]) / float(p["scheduler_s"]), rel=1e-5)
    assert float(points[1]["scheduler_s"]) > float(points[0]["scheduler_s"])  # more latency, a longer iteration

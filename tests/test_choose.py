"""Atlas's mechanisms chosen per link and regime from the plan (testbed/plan/choose.py), and the predictive
sidecar that hands turns over without a notice's reaction (sim/executor.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import testbed.sim.executor as executor
from testbed.errors import NotYetError
from testbed.plan import choose
from testbed.plan.build import boundary_connections, build_plan
from testbed.plan.choose import LinkLoad, link_loads, stagger_pays, stripe_pays, takes_turns, warmup_pays
from testbed.plan.mechanisms import AUTO_ALL, parse_scheduler
from testbed.plan.plan import LinkPlan
from testbed.runs.emulated import emulated_experiment
from testbed.sim.executor import simulate
from testbed.spec.load import load_experiment
from tests.conftest import ROOT, make_plan


def _exp(*sets: str):
    """tiny-3dc with one stage per DC, so every pipeline crosses two WAN links."""
    pin = "workload.stages_per_dc={useast: 1, uscentral: 1, uswest: 1}"
    return load_experiment(ROOT / "experiments" / "tiny-3dc.yaml", [pin, *sets])[0][0]


def test_the_atlas_base_leaves_every_mechanism_to_the_plan_and_a_modifier_pins_its_own():
    assert parse_scheduler("atlas").auto == AUTO_ALL
    assert parse_scheduler("atlas-temporal").auto == AUTO_ALL - {"temporal", "stagger"}
    assert parse_scheduler("atlas-warmup").auto == AUTO_ALL - {"warmup"}
    assert parse_scheduler("pp-wan+greedy+mtcp+warmup").auto == frozenset()


def test_a_link_that_one_pipeline_crosses_gets_no_turns_and_dp_1_no_stagger():
    plan = build_plan(_exp("workload.dp=1", "workload.global_batch=16"), "atlas")
    assert plan.dp == 1 and len(plan.dcs_used()) == 3
    assert not any(lp.temporal for lp in plan.links.values())
    assert not plan.mech.stagger and plan.replica_offset_s == [0.0]
    assert "turns" not in plan.meta["mechanisms"] and "stagger" not in plan.meta["mechanisms"]


def test_turns_only_on_links_replicas_share_and_that_are_busy_for_a_measurable_share():
    assert not takes_turns(LinkLoad(pipes=1, load=50.0))  # one pipeline: nobody to take turns with
    assert not takes_turns(LinkLoad(pipes=8, load=choose.TURNS_MIN_LOAD / 2))  # idle: nothing to gain
    assert takes_turns(LinkLoad(pipes=8, load=0.5))
    assert takes_turns(LinkLoad(pipes=1, load=0.5), kv_caches=True)  # KV caches go after training


def test_link_loads_count_each_replicas_boundary_and_the_busier_direction():
    lp = LinkPlan("a", "b", 100.0, 0.01, 1e9, 1, False)
    links = {("a", "b"): lp, ("b", "a"): replace(lp, src="b", dst="a")}
    loads = link_loads([["a", "a", "b"], ["a", "a", "b"]], [0.0, 50.0, 0.0], 4, links, compute_s=2.0)
    # two replicas x 4 microbatches x 50 bytes at 100 bytes/s = 4 s per direction, over 2 s of compute
    assert loads == {frozenset({"a", "b"}): LinkLoad(pipes=2, load=2.0, busy_s=4.0)}


def test_a_link_whose_sharers_fill_it_with_their_own_windows_is_not_striped():
    lp = LinkPlan("a", "b", capacity_bytes_s=1e9, latency_s=0.01, window_bytes=1e6, connections=64, temporal=False)
    # each boundary's 2 connections carry 2 x 1 MB / 20 ms = 100 MB/s
    assert stripe_pays(lp, LinkLoad(pipes=4, load=1.0), base_connections=2)  # 400 MB/s < 1 GB/s
    assert not stripe_pays(lp, LinkLoad(pipes=10, load=1.0), base_connections=2)  # they fill it


def test_a_plan_keeps_the_base_connections_on_links_it_does_not_stripe():
    exp = _exp()
    base = boundary_connections(parse_scheduler("atlas"), exp.workload.tp, exp.network)
    plan = build_plan(exp, "atlas")
    mech = plan.meta["mechanisms"]
    for (a, b), lp in plan.links.items():
        assert (lp.connections > base) == ("mtcp=" in mech and "-".join(sorted((a, b))) in mech.split("mtcp=")[1])


def test_a_link_that_takes_turns_stripes_to_fill_it_with_one_transfer():
    exp = _exp("topology.links.*.gbps=0.01")  # the replicas' transfers collide on a thin link: turns
    plan = build_plan(exp, "atlas")
    assert "turns=" in plan.meta["mechanisms"]
    base = boundary_connections(parse_scheduler("atlas"), exp.workload.tp, exp.network)
    turned = [lp for lp in plan.links.values() if lp.temporal]
    assert turned
    for lp in turned:  # striped exactly where one transfer's base windows fall short of the link
        assert (lp.connections > base) == (base * lp.window_bytes / lp.rtt_s < lp.capacity_bytes_s)


def test_stagger_only_interleaves_a_fixed_replica_order():
    assert stagger_pays(True, 4, "replica")
    assert not stagger_pays(True, 4, "microbatch")
    assert not stagger_pays(True, 1, "replica")
    assert not stagger_pays(False, 4, "replica")


def test_warmup_is_left_out_behind_a_link_that_turns_keep_busy_beyond_its_round_trip():
    assert warmup_pays(0.0, 0.0) and warmup_pays(0.5, 10.0)  # the link is idle half the compute
    assert warmup_pays(100.0, 0.002)  # busy, but the round trip is all latency still to cover
    assert warmup_pays(2.39, 0.805)  # both just above their floors, not their product
    assert not warmup_pays(2.66, 1.035) and not warmup_pays(4.68, 0.805)


def test_turns_go_by_earliest_microbatch_unless_replicas_outnumber_microbatches_or_gpipe_bursts():
    assert choose.turn_order(36, 48, "1f1b") == "microbatch"
    assert choose.turn_order(864, 16, "1f1b") == "replica"
    assert choose.turn_order(2, 8, "gpipe") == "replica"


def test_a_plan_whose_turn_link_is_busier_than_the_warmup_bound_runs_plain_1f1b():
    # a thin WAN: each link far busier than the compute
    exp = _exp("topology.links.*.gbps=0.001", "topology.links.*.latency_ms=50")
    plan = build_plan(exp, "atlas")
    assert "turns=" in plan.meta["mechanisms"] and "warmup" not in plan.meta["mechanisms"]
    assert plan.actions == build_plan(exp, "atlas-warmup").actions
    assert plan.actions != build_plan(exp, "atlas-temporal").actions  # without turns it warms up


def test_the_summary_names_the_mechanisms_only_where_the_plan_chose_them():
    from testbed.analysis.metrics import summary_row

    exp = _exp()
    for sched, named in (("atlas", True), ("pp-wan+mtcp", False)):
        plan = build_plan(exp, sched)
        row = summary_row(plan, simulate(plan)[0], 0.0, {})
        assert ("mechanisms" in row) == named


def _sends(sidecar: str) -> list[tuple]:
    # replica 1 starts late: its microbatch 0 takes the link from replica 0's microbatch 1 (test_turn_orders.py)
    plan = make_plan(pp=2, dp=2, m=2, f=0.5, b=0.0, schedule="gpipe", dcs=["a", "b"], act_bytes=1e9, capacity=1e9,
                     temporal=True, turn_policy="microbatch", offsets=[0.0, 1.2])
    plan.sidecar = sidecar
    tl, _ = simulate(plan)
    return sorted((iv.replica, iv.microbatch, iv.end_s) for iv in tl.intervals if iv.kind == "send")


def test_the_predictive_sidecar_hands_over_without_waiting_for_a_notice(monkeypatch):
    before = {s: _sends(s) for s in ("predictive", "reactive")}
    monkeypatch.setattr(executor, "SIDECAR_REACTION_S", 0.2)  # a slow sidecar
    after = {s: _sends(s) for s in ("predictive", "reactive")}
    assert after["predictive"] == before["predictive"]  # it never waits for a notice
    assert after["reactive"] != before["reactive"]  # the handover waits for the sender's notice


def test_the_emulated_wan_runs_the_reactive_sidecar_and_its_prediction_too():
    exp = _exp()
    assert emulated_experiment(exp, 1000.0).network.sidecar == "reactive"
    assert build_plan(emulated_experiment(exp, 1000.0), "atlas").sidecar == "reactive"
    assert build_plan(exp, "atlas").sidecar == "predictive"
    assert build_plan(exp, "atlas+bubbletea").sidecar == "reactive"  # BubbleTea's realised run: not yet
    with pytest.raises(NotYetError, match="network.sidecar"):
        emulated_experiment(_exp("network.sidecar=predictive"), 1000.0)

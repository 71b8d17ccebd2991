"""Atlas's mechanisms chosen by simulating each candidate set (testbed/plan/choose.py, testbed/sim/choose.py), and
the predictive sidecar that hands turns over without a notice's reaction (sim/executor.py)."""

from __future__ import annotations

import pytest

import testbed.sim.choose as chooser
import testbed.sim.executor as executor
from testbed.errors import SpecError
from testbed.plan import choose
from testbed.plan.choose import Pick, candidates, label, resolved
from testbed.plan.network import boundary_connections
from testbed.runs.emulated import emulated_experiment
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.spec.load import load_experiment
from testbed.spec.mechanisms import AUTO_ALL, parse_scheduler
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


BOTH = ("microbatch", "replica")


def test_candidates_switch_each_free_mechanism_on_and_off_simplest_first():
    picks = candidates(parse_scheduler("atlas"), dp=4, orders=BOTH)
    # greedy x mtcp x (no turns, turns by microbatch, by replica, by replica with stagger) x warm-up
    assert len(picks) == len(set(picks)) == 2 * 2 * 4 * 2
    assert [p.size() for p in picks] == sorted(p.size() for p in picks)
    assert picks[0] == Pick(False, False, False, False, False)
    assert {p.order for p in picks if p.turns} == set(BOTH) and {p.order for p in picks if not p.turns} == {""}


def test_the_turn_order_is_searched_unless_the_spec_names_one_or_there_is_one_replica():
    assert choose.turn_orders("auto", 36, 48, "1f1b") == ("microbatch", "replica")
    assert choose.turn_orders("auto", 864, 16, "1f1b") == ("replica", "microbatch")
    assert choose.turn_orders("auto", 1, 16, "1f1b") == ("microbatch",)
    assert choose.turn_orders("fcfs", 36, 48, "1f1b") == ("fcfs",)


def test_the_handover_is_a_candidate_where_the_spec_leaves_it():
    picks = candidates(parse_scheduler("atlas"), 4, BOTH, ("predictive", "reactive"))
    assert {p.sidecar for p in picks if p.turns} == {"predictive", "reactive"}
    assert {p.sidecar for p in picks if not p.turns} == {""}
    assert len(picks) == 2 * 2 * (1 + 3 * 2) * 2
    first = next(p for p in picks if p.turns)
    assert first.sidecar == "predictive"  # a tie keeps the predictive handover


def test_stagger_is_a_candidate_only_with_turns_several_replicas_and_the_replica_order():
    for dp, orders in ((4, ("microbatch",)), (1, BOTH)):
        assert not any(p.stagger for p in candidates(parse_scheduler("atlas"), dp, orders))
    assert all(p.turns and p.order == "replica" for p in candidates(parse_scheduler("atlas"), 4, BOTH) if p.stagger)


def test_an_ablations_candidates_are_atlas_s_with_its_mechanism_pinned():
    full = set(candidates(parse_scheduler("atlas"), 4, BOTH))
    for name, off in (("atlas-temporal", "turns"), ("atlas-stagger", "stagger"), ("atlas-warmup", "warmup"),
                      ("atlas-greedy", "greedy"), ("atlas-mtcp", "mtcp")):
        sub = set(candidates(parse_scheduler(name), 4, BOTH))
        assert sub < full and not any(getattr(p, off) for p in sub), name


def test_a_candidate_is_the_fixed_composition_of_its_mechanisms():
    atlas = parse_scheduler("atlas")
    assert resolved(atlas, Pick(True, True, False, False, True)) == parse_scheduler("pp-wan+greedy+mtcp+warmup")
    assert resolved(atlas, Pick(False, False, True, False, False)) == parse_scheduler("pp-wan+temporal-stagger")
    assert resolved(parse_scheduler("atlas+bubbletea"), Pick(False, False, True, False, False)).bubbletea


def test_bubbletea_plans_always_take_turns_and_stripe_for_the_kv_caches():
    assert all(p.turns and p.mtcp for p in candidates(parse_scheduler("atlas+bubbletea"), 1, ("microbatch",)))
    assert not any(p.mtcp for p in candidates(parse_scheduler("atlas+bubbletea-mtcp"), 1, ("microbatch",)))


def _fake(times: dict[Pick, float], fail: set[Pick], monkeypatch) -> tuple:
    """choose() over synthetic plans told apart by their capacity, with the simulated time of each set."""
    by_cap = {}

    def build(mech, given):
        pick = Pick(mech.placement == "atlas", mech.multi_tcp, mech.temporal, mech.stagger, mech.warmup, given.order)
        if pick in fail:
            raise SpecError("workload", "does not fit", "lower it")
        cap = 1e9 + list(times).index(pick) if pick in times else 2e9  # sets without a time share one plan
        by_cap[cap] = pick
        return make_plan(pp=2, m=1, f=0.1, b=0.1, dcs=["a", "b"], act_bytes=1e6, capacity=cap)

    def sim(plan, key):
        return times.get(by_cap[plan.links[("a", "b")].capacity_bytes_s], 10.0)

    monkeypatch.setattr(chooser, "simulated_s", sim)
    return build


def test_choose_keeps_the_fastest_candidate_and_ties_go_to_the_simpler(monkeypatch):
    fast, slow = Pick(True, True, True, False, True, "microbatch"), Pick(False, True, False, False, False)
    build = _fake({fast: 1.0, slow: 2.0}, set(), monkeypatch)
    plan, pick, n = chooser.choose(parse_scheduler("atlas"), 4, ("microbatch",), build)
    assert pick == fast and n == 3  # the two timed sets and one plan all the others share
    tie = Pick(False, False, False, False, True)
    build = _fake({tie: 10.0}, set(), monkeypatch)  # the same time as the shared plan
    assert chooser.choose(parse_scheduler("atlas"), 4, ("microbatch",), build)[1].size() == 0


def test_a_candidate_that_does_not_fit_is_skipped_and_all_failing_raises(monkeypatch):
    every = set(candidates(parse_scheduler("atlas"), 4, ("microbatch",)))
    ok = Pick(True, False, False, False, False)
    build = _fake({ok: 1.0}, every - {ok}, monkeypatch)
    assert chooser.choose(parse_scheduler("atlas"), 4, ("microbatch",), build)[1] == ok
    build = _fake({}, every, monkeypatch)
    with pytest.raises(SpecError, match="does not fit"):
        chooser.choose(parse_scheduler("atlas"), 4, ("microbatch",), build)


@pytest.mark.parametrize("sets", [(), ("topology.links.*.gbps=0.01",),
                                  ("topology.links.*.gbps=0.05", "topology.links.*.latency_ms=50")])
def test_the_chosen_plan_is_never_slower_in_the_simulator_than_an_ablation_or_a_fixed_composition(sets):
    exp = _exp(*sets)
    atlas_s = simulate(build_plan(exp, "atlas"))[0].iteration_s[0]
    for rival in ("atlas-temporal", "atlas-stagger", "atlas-warmup", "atlas-greedy", "atlas-mtcp",
                  "pp-wan+greedy+mtcp+warmup", "pp-wan+greedy+mtcp+temporal", "pp-wan"):
        assert atlas_s <= simulate(build_plan(exp, rival))[0].iteration_s[0], rival


def test_a_link_that_one_pipeline_crosses_gets_no_turns_and_dp_1_no_stagger():
    # one pipeline: turns change nothing in the simulator, and a tie goes to the set without them
    plan = build_plan(_exp("workload.dp=1", "workload.global_batch=16"), "atlas")
    assert plan.dp == 1 and len(plan.dcs_used()) == 3
    assert not any(lp.temporal for lp in plan.links.values())
    assert not plan.mech.stagger and plan.replica_offset_s == [0.0]
    assert "turns" not in plan.meta["mechanisms"] and "stagger" not in plan.meta["mechanisms"]


def test_the_label_names_striped_links_and_the_links_that_take_turns():
    exp = _exp()
    base = boundary_connections(parse_scheduler("atlas"), exp.workload.tp, exp.network)
    plan = build_plan(exp, "pp-wan+greedy+mtcp+temporal-stagger+warmup")
    text = label(plan, Pick(True, True, True, False, True, "microbatch"), base)
    used = {"-".join(sorted((a, b))) for a, b in zip(plan.stage_dc[0], plan.stage_dc[0][1:], strict=False) if a != b}
    striped = sorted({"-".join(sorted(h)) for h, lp in plan.links.items() if lp.connections > base} & used)
    assert text.startswith("greedy;") and text.endswith(";warmup")
    assert ("mtcp=" + "|".join(striped) in text) == bool(striped)  # only links the pipelines use
    assert "turns=useast-uscentral|uscentral-uswest" in text or "turns=uscentral-useast|uscentral-uswest" in text


def test_turns_go_by_earliest_microbatch_unless_replicas_outnumber_microbatches_or_gpipe_bursts():
    assert choose.turn_order(36, 48, "1f1b") == "microbatch"
    assert choose.turn_order(864, 16, "1f1b") == "replica"
    assert choose.turn_order(2, 8, "gpipe") == "replica"


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


def test_the_predictive_sidecar_ranks_a_start_without_a_notice_and_observes_an_end(monkeypatch):
    before = {s: _sends(s) for s in ("predictive", "reactive")}
    monkeypatch.setattr(executor, "SIDECAR_REACTION_S", 0.2)  # a slow sidecar
    after = {s: _sends(s) for s in ("predictive", "reactive")}
    taker = [x for x in before["predictive"] if x[:2] == (1, 0)][0]  # replica 1's microbatch 0 takes the link
    assert taker in after["predictive"]  # ranked from the plan as it is issued: no notice to wait for
    assert taker not in after["reactive"]  # the handover waits for the sender's notice
    # an end is observed, not predicted: the handovers at ends wait for the sidecar in both
    assert after["predictive"] != before["predictive"] and after["reactive"] != before["reactive"]


def test_the_emulated_wan_runs_the_reactive_sidecar_unless_the_spec_names_predictive():
    exp = _exp()
    assert emulated_experiment(exp).network.sidecar == "reactive"
    assert build_plan(emulated_experiment(exp), "atlas").sidecar == "reactive"
    assert build_plan(_exp("network.sidecar=predictive"), "atlas").sidecar == "predictive"
    assert build_plan(exp, "atlas+bubbletea").sidecar == "reactive"  # BubbleTea's realised run: not yet
    pinned = emulated_experiment(_exp("network.sidecar=predictive"))  # honoured: its workers announce
    assert build_plan(pinned, "atlas").sidecar == "predictive"


def test_plannable_builds_without_simulating_and_names_what_does_not_fit(monkeypatch):
    from testbed.plan.build import plannable

    monkeypatch.setattr(chooser, "simulated_s", lambda plan, key: pytest.fail("plannable simulated a plan"))
    plannable(_exp(), "atlas")
    with pytest.raises(SpecError, match="global_batch"):
        plannable(_exp("workload.global_batch=2", "workload.dp=4"), "atlas")

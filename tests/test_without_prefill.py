"""The in-run replay of training without its waits for prefill (testbed/bubbletea/without_prefill.py), checked on
the simulator's timelines, where the iteration without prefill is known."""

from __future__ import annotations

import pytest

from testbed.bubbletea.without_prefill import ReplayError, iteration_without_prefill, paired_slowdowns, summary
from testbed.plan.lower import lower
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.sim.realised import Jitter, PrefillJob, realise
from testbed.spec.load import load_experiment
from tests.conftest import ROOT


def plan_of(sched: str, *sets: str):
    (exp, _), = load_experiment(ROOT / "experiments" / "emu-bubbletea.yaml", sets=[f"schedulers=[{sched}]", *sets])
    return build_plan(exp, sched)


@pytest.mark.parametrize(("sched", "sets"), [("atlas", ()), ("pp-wan", ()), ("pp-wan", ("workload.schedule=gpipe",)),
                                              ("atlas", ("workload.dp=1",))])
def test_a_timeline_without_prefill_replays_to_itself(sched, sets):
    plan = plan_of(sched, *sets)
    progs = lower(plan)
    for tl in (simulate(plan)[0], realise(plan, Jitter(5, 0.1, 0.1)).timeline):
        assert iteration_without_prefill(progs, tl.intervals, 0.0) == pytest.approx(tl.iteration_s[0], abs=1e-12)


def test_the_replay_takes_out_a_wait_for_prefill_and_finds_the_run_without_it():
    """One replica: a prefill job that cannot pause (one layer) holds stage 1 past its first input. The replay
    of that timeline is the same noise without the job, which the simulator runs apart."""
    plan = plan_of("atlas", "workload.dp=1")
    progs = lower(plan)
    noise = Jitter(3, 0.05, 0.05)
    alone = realise(plan, noise).timeline
    arrival = min(iv.end_s for iv in alone.intervals if iv.gpu == "s1r0" and iv.kind == "recv")
    held = realise(plan, noise, {"s1r0": [PrefillJob(arrival - 0.005, 0.03, 1.0, 1, (1, 0))]}).timeline
    assert held.iteration_s[0] > alone.iteration_s[0] + 0.02  # training waited for the job
    assert iteration_without_prefill(progs, held.intervals, 0.0) == pytest.approx(alone.iteration_s[0], abs=1e-9)
    rel = paired_slowdowns(progs, held, first=0)
    assert rel == [pytest.approx(held.iteration_s[0] / alone.iteration_s[0] - 1)]


def test_prefill_in_a_gap_training_did_not_wait_for_costs_nothing():
    plan = plan_of("atlas", "workload.dp=1")
    alone = realise(plan, None).timeline
    before = min(iv.end_s for iv in alone.intervals if iv.gpu == "s2r0" and iv.kind == "recv")
    tl = realise(plan, None, {"s2r0": [PrefillJob(0.0, before / 2, 1.0, 1, (1, 0))]}).timeline
    assert any(iv.kind == "prefill" for iv in tl.intervals)
    assert paired_slowdowns(lower(plan), tl, first=0) == [pytest.approx(0.0, abs=1e-12)]


def test_a_timeline_that_misses_an_op_is_refused():
    plan = plan_of("pp-wan")
    tl = simulate(plan)[0]
    ivs = [iv for iv in tl.intervals if not (iv.gpu == "s1r0" and iv.kind == "fwd" and iv.microbatch == 2)]
    with pytest.raises(ReplayError, match="s1r0: no fwd interval of microbatch 2"):
        iteration_without_prefill(lower(plan), ivs, 0.0)


def test_summary_is_median_and_quartiles():
    assert summary([0.0, 0.01, 0.02, 0.03, 0.04]) == pytest.approx((0.02, 0.01, 0.03))

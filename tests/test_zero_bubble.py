"""The zero-bubble schedule (`schedule: zb`): the backward split into B and W, W deferred into the bubbles."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.analysis.invariants import check_timeline
from testbed.plan.lower import dry_run, lower
from testbed.plan.schedules import Action, zero_bubble
from testbed.plan.synthetic import make_plan
from testbed.program import Backward, BackwardWeight, Program
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.spec.load import load_experiment
from tests.conftest import ROOT


@given(pp=st.integers(1, 8), m=st.integers(1, 20))
def test_each_stage_runs_f_then_b_then_w_and_holds_at_most_pp_activations(pp, m):
    for acts in zero_bubble(pp, m):
        for i in range(m):
            assert acts.index(Action("F", i)) < acts.index(Action("B", i)) < acts.index(Action("W", i))
        assert len(acts) == 3 * m
        held = peak = 0
        for a in acts:  # activations live from F until W
            held += {"F": 1, "B": 0, "W": -1}[a.op]
            peak = max(peak, held)
        assert peak <= pp  # 1F1B's peak (its first stage)


@settings(max_examples=30, deadline=None)
@given(pp=st.integers(2, 8), m=st.integers(1, 24))
def test_bubble_lies_between_pp_minus_1_and_twice_that_passes_never_above_1f1b(pp, m):
    """F = B = W = 1 (b = 2: W is half the backward): 1F1B idles 3 (pp - 1) passes; deferring W lets a stage pass
    a gradient upstream after B alone, so no fewer than pp - 1 remain (ZB-H1's bound) and, when m = pp, exactly."""
    def bubble(schedule: str) -> float:
        return simulate(make_plan(pp=pp, m=m, f=1.0, b=2.0, schedule=schedule))[0].iteration_s[0] - 3 * m

    zb, plain = bubble("zb"), bubble("1f1b")
    assert plain == pytest.approx(3 * (pp - 1))
    assert pp - 1 - 1e-9 <= zb <= min(plain, 2 * (pp - 1)) + 1e-9
    if m == pp:
        assert zb == pytest.approx(pp - 1)


@settings(max_examples=40, deadline=None)
@given(pp=st.integers(1, 6), m=st.integers(1, 8), dp=st.integers(1, 3), split=st.integers(0, 6),
       temporal=st.booleans(), latency=st.sampled_from([0.0, 0.004, 0.03]))
def test_random_zero_bubble_plans_lower_without_deadlock_and_keep_invariants(pp, m, dp, split, temporal, latency):
    dcs = ["a" if s < min(split, pp) else "b" for s in range(pp)]
    plan = make_plan(pp=pp, dp=dp, m=m, f=0.01, b=0.02, dcs=dcs, act_bytes=2e6, grad_bytes=1e7, capacity=1e9,
                     latency=latency, window=2**20, temporal=temporal, intra_bw=1e10, schedule="zb")
    programs = lower(plan)
    assert dry_run(programs) == []
    for p in programs.values():
        assert Program.from_json(p.to_json()) == p
    tl, _ = simulate(plan)
    assert check_timeline(tl, plan) == []


def test_b_and_w_split_the_backward_and_w_is_the_weight_gemms():
    (exp, _), = load_experiment(ROOT / "experiments" / "tiny-3dc.yaml", sets=["workload.schedule=zb"])
    plan = build_plan(exp, "pp-wan")
    prog = lower(plan)["s1r0"]
    b = [s for s in prog.steps if isinstance(s, Backward)]
    w = [s for s in prog.steps if isinstance(s, BackwardWeight)]
    assert len(b) == len(w) == plan.microbatches
    assert b[0].seconds + w[0].seconds == pytest.approx(plan.bwd_s[0][1])
    assert 0 < w[0].seconds < b[0].seconds + 1e-12 and w[0].seconds <= plan.fwd_s[0][1]

"""A sync period simulated compressed (testbed/sim/period.py) against the whole period on random small DiLoCo and
Streaming DiLoCo jobs: the same iteration, the same busy and idle time, the same intervals; an inner step that is
not the one before it shifted is caught."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.sim.aggregate import FULL_STAGE_MICROBATCHES, stage_microbatches
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate as simulate_full
from testbed.sim.period import PeriodTimeline, _shifts, _syncs_apart, compresses, kept_steps, simulate
from testbed.spec.load import load_experiment
from tests.conftest import ROOT

MODEL = "workload.model={name: m350, layers: 24, hidden: 1024, heads: 16, vocab: 32000, seq_len: 2048}"


def plan_of(sched: str, pp: int, dp: int, m: int, *sets: str):
    sets = (f"workload.pp={pp}", f"workload.dp={dp}", f"workload.global_batch={m * dp}", MODEL, *sets)
    return build_plan(load_experiment(ROOT / "experiments" / "emu-3dc.yaml", sets=list(sets))[0][0], sched)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=12, deadline=None)
@given(
    sched=st.sampled_from(["diloco", "streaming-diloco"]),
    shape=st.sampled_from([(1, 3), (1, 6), (2, 3)]),  # (pp, dp): DCs of 2, 2 and 1 replicas; of 2 each; of 1 each
    m=st.integers(1, 3),
    per=st.integers(6, 12),
    schedule=st.sampled_from(["1f1b", "gpipe"]),
)
def test_compressed_period_matches_the_whole_period(sched, shape, m, per, schedule):
    pp, dp = shape
    frags = 1 if sched == "diloco" else 2
    plan = plan_of(sched, pp, dp, m, f"workload.diloco.inner_steps={per * frags}", f"workload.schedule={schedule}",
                   *([] if sched == "diloco" else [f"workload.diloco.fragments={frags}"]))
    assert not compresses(plan)  # small: the whole period, unless forced
    full, _ = simulate(plan)
    short, _ = simulate(plan, compress=True)
    assert not isinstance(full, PeriodTimeline)
    # DCs with more replicas have a longer inner all-reduce: their inner steps are shifts by another Delta, and
    # repeating them would move the DCs' syncs apart, so that period is simulated whole; so is one where a DC joins
    # a fragment's sync while the one before still runs in another DC (closer still in the compressed period)
    if shape == (1, 3) or not _syncs_apart(full._raw[2]):
        assert not isinstance(short, PeriodTimeline)
    elif shape == (1, 6):
        assert isinstance(short, PeriodTimeline)
    assert close(short.iteration_s[0], full.iteration_s[0])
    for kinds in (("fwd", "bwd"), ("allreduce",), ("optimizer",), ("idle",), ("send", "outersync")):
        assert close(short.busy_time(kinds), full.busy_time(kinds)), kinds
    a, b = full.intervals, short.intervals
    assert [(x.kind, x.microbatch, x.replica, x.stage) for x in a] == [(x.kind, x.microbatch, x.replica, x.stage)
                                                                       for x in b]
    T = full.iteration_s[0]
    tol = 1e-9 * T
    assert all(abs(x.start_s - y.start_s) <= tol and abs(x.end_s - y.end_s) <= tol for x, y in zip(a, b, strict=True))


def test_a_long_period_is_compressed_without_asking():
    plan = plan_of("diloco", 2, 3, 2, "workload.diloco.inner_steps=10")
    assert not compresses(plan)
    long = plan_of("diloco", 2, 3, 2, "workload.diloco.inner_steps=25000", "workload.token_efficiency=1")
    assert stage_microbatches(long, 3) > FULL_STAGE_MICROBATCHES  # three replicas simulated, one per DC
    assert compresses(long)


def test_a_step_that_is_not_a_shift_is_caught():
    plan = plan_of("diloco", 2, 3, 2, "workload.diloco.inner_steps=10")
    from dataclasses import replace

    short = replace(plan, diloco=replace(plan.diloco, inner_steps=kept_steps(plan)))
    tl, _ = simulate_full(short)
    raw = list(tl._raw[2])
    assert _shifts(short, raw) is not None
    i = max(i for i, x in enumerate(raw) if x[1] == "fwd" and x[2] // short.microbatches == 2)  # step 2's last
    g, kind, mb, t0, t1, nbytes = raw[i]
    raw[i] = (g, kind, mb, t0, t1 + 1e-3, nbytes)  # a forward of step 2 a millisecond longer than step 1's
    assert _shifts(short, raw) is None


def test_syncs_that_share_the_wan_are_simulated_whole():
    """Streaming DiLoCo on three DCs whose syncs take far longer than a segment's inner steps: the DC whose ring part
    ends first joins fragment 1's sync while fragment 0's still runs in the others, so the period is simulated
    whole, not compressed (repeating inner steps would move the two rings apart on the links they share)."""
    plan = plan_of("streaming-diloco", 2, 3, 1, "workload.diloco.inner_steps=12", "workload.diloco.fragments=2")
    full, _ = simulate(plan)
    assert not _syncs_apart(full._raw[2])
    syncs = [x for x in full.intervals if x.kind == "outersync"]
    assert min(x.start_s for x in syncs if x.microbatch == 1) < max(x.end_s for x in syncs if x.microbatch == 0)
    assert not isinstance(simulate(plan, compress=True)[0], PeriodTimeline)

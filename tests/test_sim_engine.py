"""How the simulator is made fast (docs/simulator-speed.md), checked against the slow way of getting the
same answer: steps shared between groups of one shape, the lower-bound run's collapsed replicas, groups
running ahead of the event clock, equal-time order, metrics from the executor's tuples."""

from __future__ import annotations

import gc
from dataclasses import replace

import pytest

from testbed.plan.lower import allreduce, lower_group, program_shape
from testbed.plan.schedules import build_schedule
from testbed.runs.simulated import lower_bound_s
from testbed.sim import executor
from testbed.sim.choose import build_plan
from testbed.sim.executor import Simulation, compile_steps, replica_classes, simulate
from testbed.spec.load import load_experiment
from testbed.timeline import Timeline
from tests.conftest import ROOT, make_plan


def _mixed_plan():
    """Four replicas on a temporal WAN; replica 2 runs on slower GPUs (another program shape)."""
    plan = make_plan(pp=3, dp=4, m=3, f=0.01, b=0.02, dcs=["a", "a", "b"], act_bytes=2e6, grad_bytes=1e7,
                     capacity=1e9, latency=0.01, window=2**20, connections=4, temporal=True, intra_bw=1e10,
                     offsets=[0.0, 0.0, 0.004, 0.004])
    plan.fwd_s[2] = [0.02] * 3
    plan.bwd_s[2] = [0.04] * 3
    return plan


def test_groups_of_one_shape_share_steps_lowered_once():
    plan = _mixed_plan()
    sim = Simulation(plan)
    reduces = [allreduce(plan, s) for s in range(plan.pp)]
    for k, r in enumerate(sim.reps):
        for s in range(plan.pp):
            own = compile_steps(lower_group(plan, s, r, reduces[s]).steps, s, r, plan.microbatches)
            assert sim.steps[k * plan.pp + s] == own  # lowering the group itself gives the same steps
    shapes = {program_shape(plan, s, r) for r in sim.reps for s in range(plan.pp)}
    assert len({id(st) for st in sim.steps}) == len(shapes) == 2 * plan.pp


def test_lower_bound_collapses_replicas_that_take_turns_only_on_the_wan(monkeypatch):
    plan = _mixed_plan()
    assert len(replica_classes(plan)) == plan.dp  # turns on the WAN: every replica is simulated
    ideal = replace(plan, ideal_wan=True, replica_offset_s=[0.0] * plan.dp)
    assert len(replica_classes(ideal)) == 2  # no WAN flows in the lower-bound run: two shapes of replica
    collapsed = lower_bound_s(plan)
    monkeypatch.setattr(executor, "replica_classes", lambda p, block=None: {r: [r] for r in range(p.dp)})
    assert lower_bound_s(plan) == collapsed


def test_equal_time_events_go_in_the_order_they_were_caused():
    """Replica 0's transfer ends at 0.03 exactly when replica 1's transfer (issued by a compute that started
    later) joins the link: the ending one goes first, so it ends alone at its own rate."""
    plan = make_plan(pp=2, dp=2, m=1, f=0.01, b=0.02, dcs=["a", "b"], act_bytes=2e6, capacity=1e8,
                     latency=0.001, window=2**20, connections=8, offsets=[0.0, 0.02])
    sim = Simulation(plan)
    sim.run()
    sends = {g // plan.pp: (t0, t1) for g, kind, _mb, t0, t1, _b in sim.out if kind == "send" and g % plan.pp == 0}
    assert sends[0] == (0.01, 0.01 + 2e6 / 1e8)
    assert sends[1][0] == sends[0][1]


def test_a_transfer_that_ends_is_not_overtaken_by_one_issued_at_that_moment():
    """Temporal sharing, replica 0 first: replica 1's transfer ends at 0.03 exactly when replica 0 (its
    compute started earlier) issues its own. The ending transfer is done; it is not paused behind the new one
    with nothing left to send."""
    A, C = 2e6, 1e8
    plan = make_plan(pp=2, dp=2, m=1, f=0.01, b=0.02, dcs=["a", "b"], act_bytes=A, capacity=C, latency=0.001,
                     window=2**20, connections=64, temporal=True)
    plan.fwd_s[0] = [0.03, 0.03]
    sim = Simulation(plan)
    sim.run()
    ends = {g // plan.pp: t1 for g, kind, _mb, _t0, t1, _b in sim.out if kind == "send" and g % plan.pp == 0}
    assert ends[1] == 0.01 + A / C == 0.03
    assert ends[0] == 0.03 + A / C


def test_a_deadlocked_schedule_is_reported():
    plan = make_plan(pp=2, m=2, schedule="gpipe")
    plan.actions = build_schedule("gpipe", 2, 2)
    plan.actions[0] = plan.actions[0][::-1]  # stage 0 waits for a gradient before sending the activation
    with pytest.raises(RuntimeError, match="deadlocked"):
        simulate(plan)


@pytest.mark.parametrize("sched", ["dp-wan", "pp-wan", "atlas"])
def test_metrics_from_the_executors_tuples_equal_those_from_intervals(sched):
    exp = load_experiment(ROOT / "experiments" / "tiny-3dc.yaml", sets=["workload.dp=4"])[0][0]
    plan = build_plan(exp, sched)
    tl, _ = simulate(plan)
    built = Timeline(tl.run_id, tl.source, tl.rep_intervals(), tl.iteration_s, tl.groups, tl.copies)
    fresh, _ = simulate(plan)
    assert fresh._raw is not None and built._raw is None
    assert fresh.busy_time(("idle",)) == built.busy_time(("idle",))  # same gaps, same order: exact
    for kinds in (("fwd", "bwd"), ("fwd", "bwd", "prefill"), ("send",)):
        assert fresh.busy_time(kinds) == pytest.approx(built.busy_time(kinds), rel=1e-12)
    assert fresh.only_replicas(2).intervals == built.only_replicas(2).intervals


def test_runs_are_deterministic_and_leave_the_garbage_collector_as_found():
    plan = _mixed_plan()
    first = Simulation(plan)
    first.run()
    assert gc.isenabled()
    simulate(plan)
    assert gc.isenabled()
    gc.disable()
    try:
        simulate(plan)
        assert not gc.isenabled()
    finally:
        gc.enable()
    again = Simulation(plan)
    again.run()
    assert again.out == first.out and again.events == first.events

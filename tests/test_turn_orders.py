"""Turn orders under temporal sharing (testbed/plan/turns.py): each does what it says, on one link."""

from __future__ import annotations

import pytest

from testbed.plan.turns import TURN_KEYS
from testbed.sim.executor import simulate
from tests.conftest import ROOT, make_plan

A, C = 1e9, 1e9  # one transfer takes A / C = 1 s at full rate


def _sends(policy: str, dp: int, m: int, offsets=None) -> list:
    plan = make_plan(pp=2, dp=dp, m=m, f=0.5, b=0.0, schedule="gpipe", dcs=["a", "b"], act_bytes=A, capacity=C,
                     temporal=True, turn_policy=policy, offsets=offsets)
    tl, _ = simulate(plan)
    return sorted((iv for iv in tl.intervals if iv.kind == "send" and iv.stage == 0), key=lambda iv: iv.end_s)


def test_replica_order_gives_the_first_replica_the_link_whenever_it_has_data():
    sends = _sends("replica", dp=2, m=3)
    first = [iv for iv in sends if iv.replica == 0]
    # replica 0 never waits for replica 1: its k-th activation leaves at max(issue, previous) + A/C
    assert [iv.end_s for iv in first] == pytest.approx([1.5, 2.5, 3.5])
    assert [iv.replica for iv in sends] == [0, 0, 0, 1, 1, 1]


def test_first_come_first_served_follows_issue_order_across_replicas():
    sends = _sends("fcfs", dp=2, m=2, offsets=[0.0, 0.25])
    assert [(iv.replica, iv.microbatch) for iv in sends] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    issued = [iv.start_s for iv in sends]
    assert issued == sorted(issued)


def test_microbatch_order_lets_an_earlier_microbatch_preempt():
    # replica 1 starts late; its microbatch 0 overtakes replica 0's microbatch 1, already on the link
    sends = _sends("microbatch", dp=2, m=2, offsets=[0.0, 1.2])
    assert [(iv.replica, iv.microbatch) for iv in sends] == [(0, 0), (1, 0), (0, 1), (1, 1)]


@pytest.mark.parametrize("policy", list(TURN_KEYS))
def test_orders_agree_when_the_link_is_not_contended(policy):
    """Turns only decide who waits: with one replica every order gives the same timeline."""
    plan = make_plan(pp=2, dp=1, m=4, f=0.5, b=0.2, dcs=["a", "b"], act_bytes=A, capacity=C, temporal=True,
                     turn_policy=policy)
    ref = make_plan(pp=2, dp=1, m=4, f=0.5, b=0.2, dcs=["a", "b"], act_bytes=A, capacity=C, temporal=True)
    assert simulate(plan)[0].iteration_s == simulate(ref)[0].iteration_s


def test_orders_differ_when_replicas_contend():
    its = {p: simulate(make_plan(pp=2, dp=3, m=4, f=0.5, b=0.2, dcs=["a", "b"], act_bytes=A, capacity=C,
                                 temporal=True, turn_policy=p))[0] for p in TURN_KEYS}
    ends = {p: sorted(iv.end_s for iv in tl.intervals if iv.kind == "recv") for p, tl in its.items()}
    assert len({tuple(round(x, 9) for x in e) for e in ends.values()}) > 1


def test_auto_order_lets_one_replica_at_a_time_have_a_link_the_job_saturates():
    from testbed.sim.choose import build_plan
    from testbed.spec.load import load_experiment

    for gbps, expect in ((0.001, "replica"), (50000, "microbatch")):
        exp = load_experiment(ROOT / "experiments" / "tiny-3dc.yaml", sets=[f"topology.links.*.gbps={gbps}"])[0][0]
        plan = build_plan(exp, "pp-wan+temporal")  # stages split over the DCs: the pipeline crosses the WAN
        assert (plan.wan_load() >= 1) == (expect == "replica")
        assert plan.turn_policy == expect

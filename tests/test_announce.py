"""The predictive sidecar: which sends a worker announces, when, and how the sidecar ranks announcements."""

from __future__ import annotations

import time

import pytest

from testbed.plan.lower import lower_group
from testbed.program import Backward, BackwardWeight, Forward, Send
from testbed.runtime.announce import announcement, producers
from testbed.runtime.sidecar import Sidecar
from testbed.runtime.wire import ProtocolError
from tests.conftest import make_plan
from tests.test_sidecar_logic import FakeNetlink

COMPUTE = (Forward, Backward, BackwardWeight)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_every_send_is_announced_once_as_the_compute_that_produces_it_starts(schedule):
    plan = make_plan(pp=3, m=4, f=1.0, b=2.0, schedule=schedule, dcs=["a", "b", "c"], act_bytes=1e6)
    for s in range(plan.pp):
        steps = lower_group(plan, s, 0).steps
        made = producers(steps)
        sends = [i for i, st in enumerate(steps) if isinstance(st, Send)]
        assert sorted(j for js in made.values() for j in js) == sends  # each once
        for i, js in made.items():
            assert isinstance(steps[i], COMPUTE)
            for j in js:  # its output: no compute between the producer and the send
                assert not any(isinstance(st, COMPUTE) for st in steps[i + 1:j])
                assert steps[j].microbatch == steps[i].microbatch


def test_a_send_with_no_compute_before_it_is_not_announced():
    steps = [Send("a", 0, "s1r0", 1.0), Forward(0, 1.0), Send("a", 0, "s1r0", 1.0)]
    assert producers(steps) == {1: (2,)}
    msg = announcement(steps[2], 3, 7, 0, 12.5)
    assert msg == {"op": "announce", "replica": 3, "mb": 0, "kind": "a", "id": "3a7.0", "at": 12.5}


def _sidecar(policy: str = "fcfs", predictive: bool = True) -> tuple[Sidecar, FakeNetlink]:
    nl = FakeNetlink()
    cfg = {"devs": {"useast": {"0": 0x100, "1": 0x101}}, "turn_order": [0, 1], "link_bps": 200e6,
           "min_rate_bps": 2e6, "mtu": 9000, "notice_delay_s": 0.5, "turn_policy": policy, "predictive": predictive}
    return Sidecar(cfg, nl, tc=nl), nl


def _lead(nl: FakeNetlink) -> str:
    """The class the last change gave the link's rate."""
    return [c[1] for c in nl.calls if c[2] == 200e6][-1]


def _msg(op: str, r: int, mb: int, tid: str, at: float | None = None) -> dict:
    m = {"op": op, "dev": "useast", "replica": r, "mb": mb, "kind": "a", "id": tid}
    return m if at is None else {**m, "at": at}


def test_announcements_rank_at_once_first_come_first_served_by_when_they_will_be_issued():
    side, nl = _sidecar()
    later = time.monotonic() + 60
    side.handle(_msg("announce", 1, 0, "x", later + 1))  # arrives first, issued later
    side.handle(_msg("announce", 0, 5, "y", later))
    assert side.drained(2.0)  # no notice delay: ranked before the data reaches the shaper
    assert _lead(nl) == "1:100"  # replica 0's is issued first: it leads
    n = len(nl.calls)
    side.handle(_msg("issue", 0, 5, "y"))  # announced: the issue changes nothing
    assert side.drained(2.0) and len(nl.calls) == n
    side.handle({"op": "end", "id": "y"})  # observed at the shaper: applied at once, not a latency later
    assert side.drained(0.4) and _lead(nl) == "1:101"
    assert side.counts == {"announced": 2, "late": 0, "repeated": 0, "unannounced": 0}


def test_late_repeated_unannounced_and_left_ranked_are_counted():
    side, nl = _sidecar("replica")
    side.handle(_msg("announce", 0, 0, "a", time.monotonic() - 1))  # its `at` has passed: late, still ranked
    side.handle(_msg("announce", 0, 0, "a", time.monotonic() + 1))  # the same id again: ignored
    side.handle(_msg("issue", 1, 0, "b"))  # nobody announced it: ranked at its issue
    side.handle(_msg("announce", 1, 0, "b", time.monotonic() + 1))  # its announcement after the issue: late
    assert side.drained(2.0)
    assert side.counts == {"announced": 3, "late": 2, "repeated": 1, "unannounced": 1}
    assert side.left_ranked() == 2 and "2 left ranked" in side.summary()
    side.handle({"op": "end", "id": "a"})
    side.handle(_msg("issue", 0, 0, "a"))  # an issue heard after its end ranks nothing again
    assert side.drained(2.0) and side.left_ranked() == 1


def test_a_reactive_sidecar_refuses_announcements_and_keeps_its_notice_delay():
    side, nl = _sidecar(predictive=False)
    with pytest.raises(ProtocolError, match="reactive"):
        side.handle(_msg("announce", 0, 0, "a", 1.0))
    side.handle(_msg("start", 0, 0, "a"))
    assert nl.calls == [] and side.summary() == ""  # held one latency, as the data is

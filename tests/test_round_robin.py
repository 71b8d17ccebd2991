"""Symmetric replicas on a fair-shared WAN link: the round robin's head start (testbed/sim/executor.py
round_robin_lags) takes them out of exact lockstep, deterministically."""

from __future__ import annotations

from dataclasses import replace

from testbed.runtime.htb import FRAME_BYTES
from testbed.sim.executor import ROUND_ROBIN_PHASES, Simulation, replica_classes, round_robin_lags
from tests.conftest import make_plan

C = 1e8  # bytes/s


def _fair(dp: int, **kw):
    args = dict(pp=2, dp=dp, m=4, f=0.01, b=0.02, dcs=["a", "b"], act_bytes=2e6, capacity=C, latency=0.005,
                window=2**22, connections=2, intra_bw=1e10)
    return make_plan(**{**args, **kw})


def _first_arrivals(sim: Simulation) -> dict[int, float]:
    """Replica -> when its first activation reached stage 1."""
    out: dict[int, float] = {}
    for g, kind, mb, _t0, t1, _b in sim.out:
        if kind == "recv" and g % sim.p.pp == 1 and mb == 0:
            r = sim.reps[g // sim.p.pp]
            out[r] = min(out.get(r, t1), t1)
    return out


def test_each_replica_a_turn_behind_the_one_before_it():
    plan = _fair(3)  # a real link: one jumbo frame per turn
    assert round_robin_lags(plan) == [0.0, FRAME_BYTES / C, 2 * FRAME_BYTES / C]
    assert len(replica_classes(plan)) == 3  # no longer run as one
    turn = 40 * FRAME_BYTES  # an emulated link's turn in real-world bytes (k x its quantum)
    coarse = replace(plan, links={k: replace(lp, turn_bytes=turn) for k, lp in plan.links.items()})
    assert round_robin_lags(coarse) == [0.0, turn / C, 2 * turn / C]


def test_symmetric_replicas_on_a_fair_link_no_longer_finish_in_lockstep():
    sim = Simulation(_fair(2))
    sim.run()
    first = _first_arrivals(sim)
    assert first[1] > first[0]  # the second class in the round finishes its first transfer later
    per_replica = [sorted((g % 2, k, mb, t0, t1) for g, k, mb, t0, t1, _ in sim.out if g // 2 == i) for i in (0, 1)]
    assert per_replica[0] != per_replica[1]


def test_the_same_plan_gives_the_same_timeline():
    runs = []
    for _ in range(2):
        sim = Simulation(_fair(3))
        sim.run()
        runs.append(sim.out)
    assert runs[0] == runs[1]


def test_no_head_start_where_the_sidecar_orders_turns_or_no_wan_link_is_used():
    temporal = _fair(3, temporal=True)
    assert round_robin_lags(temporal) == [0.0] * 3
    ideal = replace(_fair(3), ideal_wan=True)
    assert round_robin_lags(ideal) == [0.0] * 3
    assert replica_classes(ideal) == {0: [0, 1, 2]}  # the lower-bound run still merges them
    inside = _fair(3, dcs=["a", "a"])
    assert replica_classes(inside) == {0: [0, 1, 2]}


def test_replicas_that_differ_get_no_head_start_from_each_other():
    plan = _fair(2, offsets=[0.0, 0.004])  # not symmetric: they do not reach the link together
    assert round_robin_lags(plan) == [0.0, 0.0]


def test_many_replicas_share_head_starts_in_blocks():
    dp = 5 * ROUND_ROBIN_PHASES
    plan = _fair(dp)
    classes = replica_classes(plan)
    assert len(classes) == ROUND_ROBIN_PHASES
    assert sorted(r for rs in classes.values() for r in rs) == list(range(dp))
    lags = round_robin_lags(plan)
    assert lags == sorted(lags) and len(set(lags)) == ROUND_ROBIN_PHASES
    sim = Simulation(plan)
    sim.run()  # each block runs once, standing for its replicas
    assert sim.weight == [5] * ROUND_ROBIN_PHASES

"""The aggregated simulation (testbed/sim/aggregate.py) against the full one on random small jobs: replicas taking
turns simulated in blocks move the same bytes over each link, do the same compute, keep every timeline invariant
and never beat the job's lower bound; a block of one is the full simulation, which every job up to the bound gets."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.analysis.invariants import check_timeline
from testbed.plan.synthetic import make_plan
from testbed.sim.aggregate import FULL_STAGE_MICROBATCHES, turn_block, turn_blocks
from testbed.sim.executor import Simulation, paused_gc, replica_classes, simulate


def _run(plan, block: int | None):
    with paused_gc():
        sim = Simulation(plan, turn_block=block)
        tl = sim.run()
    return tl, sim


def test_blocks_are_consecutive_runs_in_turn_order_of_one_shape():
    plan = make_plan(pp=2, dp=7, m=2, dcs=["a", "b"], temporal=True)
    plan.turn_order = [3, 4, 5, 6, 0, 1, 2]
    plan.fwd_s[5] = [2.0, 2.0]  # replica 5 costs more: it cannot stand for 4 or 6, nor they for it
    assert turn_blocks(plan, 3) == {3: [3, 4], 5: [5], 6: [6, 0, 1], 2: [2]}  # runs in the turn order
    assert turn_blocks(plan, 1) == {r: [r] for r in range(7)}


def test_full_simulation_up_to_the_bound_then_blocks():
    small = make_plan(pp=4, dp=8, m=4, dcs=["a", "a", "b", "b"], temporal=True)
    assert turn_block(small) == 1
    assert replica_classes(small) == {r: [r] for r in range(8)}
    dp = FULL_STAGE_MICROBATCHES // (16 * 16) + 1  # one replica past the bound at pp 16, 16 microbatches
    big = make_plan(pp=16, dp=dp, m=16, dcs=["a"] * 8 + ["b"] * 8, temporal=True)
    assert turn_block(big) > 1
    assert len(replica_classes(big)) < dp
    assert replica_classes(replace(big, ideal_wan=True)) != replica_classes(big)  # the lower bound: one class


@settings(max_examples=40, deadline=None)
@given(
    pp=st.integers(2, 4),
    dp=st.integers(2, 7),
    m=st.integers(1, 5),
    block=st.integers(2, 4),
    schedule=st.sampled_from(["1f1b", "gpipe"]),
    capacity=st.sampled_from([1e8, 1e9]),
    latency=st.sampled_from([0.0, 0.001, 0.02]),
    conns=st.sampled_from([1, 8]),
    stagger=st.floats(0, 0.05),
    policy=st.sampled_from(["replica", "microbatch"]),
)
def test_aggregated_matches_full_on_random_jobs(pp, dp, m, block, schedule, capacity, latency, conns, stagger, policy):
    dcs = ["a"] * (pp // 2) + ["b"] * (pp - pp // 2)
    plan = make_plan(pp=pp, dp=dp, m=m, f=0.01, b=0.02, schedule=schedule, dcs=dcs, act_bytes=2e6, grad_bytes=1e7,
                     capacity=capacity, latency=latency, window=2**20, connections=conns, temporal=True,
                     intra_bw=1e10, offsets=[r * stagger for r in range(dp)], turn_policy=policy)
    full, full_sim = _run(plan, None)
    assert full.iteration_s == simulate(plan, turn_block=1)[0].iteration_s  # below the bound: the full simulation
    agg, agg_sim = _run(plan, block)
    assert len(agg_sim.reps) == len(turn_blocks(plan, block)) < dp
    for link, ls in full_sim.links.items():  # the same bytes over every link, a block's counted once per replica
        assert math.isclose(agg_sim.links[link].bytes_total, ls.bytes_total, rel_tol=1e-9), link
    for kinds in (("fwd",), ("bwd",)):  # the same compute, every replica
        assert math.isclose(agg.busy_time(kinds), full.busy_time(kinds), rel_tol=1e-9)
    assert {iv.replica for iv in agg.intervals} == set(range(dp))
    assert check_timeline(agg, plan) == []
    lower, _ = simulate(replace(plan, ideal_wan=True, replica_offset_s=[0.0] * dp))
    assert agg.iteration_s[0] >= lower.iteration_s[0] * (1 - 1e-9)

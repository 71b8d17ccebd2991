"""Hand-built plans with equal stages: closed-form checks, worked examples, benchmarks."""

from __future__ import annotations

from testbed.plan.plan import IntraDC, LinkPlan, Plan
from testbed.plan.schedules import build_schedule
from testbed.spec.mechanisms import Mechanisms

INF = float("inf")


def make_plan(
    *,
    pp: int = 4,
    dp: int = 1,
    m: int = 8,
    f: float = 1.0,
    b: float = 2.0,
    schedule: str = "1f1b",
    dcs: list[str] | None = None,
    act_bytes: float = 0.0,
    grad_bytes: float = 0.0,
    capacity: float = INF,
    latency: float = 0.0,
    window: float = 1e9,
    connections: int = 1,
    temporal: bool = False,
    intra_bw: float = INF,
    offsets: list[float] | None = None,
    turn_policy: str = "replica",
    virtual_stages: int = 1,
) -> Plan:
    """A plan with equal stages; `dcs[s]` places stage s (all replicas alike); with `virtual_stages` V each
    stage holds V equal model chunks (f / V and b / V each) run in the interleaved 1F1B."""
    dcs = dcs or ["a"] * pp
    names = sorted(set(dcs))
    links = {}
    for x in names:
        for y in names:
            if x != y:
                links[(x, y)] = LinkPlan(x, y, capacity, latency, window, connections, temporal)
    V = virtual_stages
    plan = Plan(
        run_id="t", scheduler="test", mech=Mechanisms("atlas", connections > 1, temporal, False), model="test",
        gpu_types={n: "H100" for n in names}, tp=1, pp=pp, dp=dp, microbatches=m, microbatch_size=1,
        seq_len=1, global_batch=m * dp, stage_dc=[list(dcs) for _ in range(dp)],
        fwd_s=[[f] * pp for _ in range(dp)], bwd_s=[[b] * pp for _ in range(dp)],
        act_bytes=[act_bytes] * pp, grad_bytes=[grad_bytes] * pp, mem_gb=[0.0] * pp,
        actions=build_schedule(schedule, pp, m, v=V), links=links,
        intra={n: IntraDC(intra_bw, 0.0) for n in names}, replica_offset_s=offsets or [0.0] * dp,
        turn_order=list(range(dp)), turn_policy=turn_policy, virtual_stages=V,
    )
    if schedule == "zb":  # the weight gradient: half the backward
        plan.wgrad_s = [[b / 2] * pp for _ in range(dp)]
    if V > 1:
        plan.chunk_fwd_s = [[[f / V] * V for _ in range(pp)] for _ in range(dp)]
        plan.chunk_bwd_s = [[[b / V] * V for _ in range(pp)] for _ in range(dp)]
    return plan

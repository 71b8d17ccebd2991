"""Invariants on every simulated timeline: random small plans and real experiment plans."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.analysis.invariants import check_timeline
from testbed.plan.schedules import build_schedule
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.spec.load import load_experiment
from tests.conftest import ROOT, make_plan


@settings(max_examples=60, deadline=None)
@given(
    pp=st.integers(1, 5),
    dp=st.integers(1, 3),
    m=st.integers(1, 6),
    schedule=st.sampled_from(["1f1b", "gpipe"]),
    split=st.integers(0, 4),
    latency=st.sampled_from([0.0, 0.001, 0.03]),
    capacity=st.sampled_from([1e8, 1e9, float("inf")]),
    conns=st.sampled_from([1, 8]),
    temporal=st.booleans(),
    stagger=st.floats(0, 0.5),
    extra=st.lists(st.integers(0, 6), min_size=5, max_size=5),
)
def test_random_plans_keep_invariants(pp, dp, m, schedule, split, latency, capacity, conns, temporal, stagger,
                                      extra):
    dcs = ["a" if s < min(split, pp) else "b" for s in range(pp)]
    plan = make_plan(pp=pp, dp=dp, m=m, f=0.01, b=0.02, schedule=schedule, dcs=dcs, act_bytes=2e6,
                     grad_bytes=1e7, capacity=capacity, latency=latency, window=2**20, connections=conns,
                     temporal=temporal, intra_bw=1e10, offsets=[r * stagger for r in range(dp)])
    plan.actions = build_schedule(schedule, pp, m, sorted(extra[:pp], reverse=True))  # extra warm-up, any depth
    tl, _ = simulate(plan)
    assert check_timeline(tl, plan) == []
    assert tl.iteration_s[0] > 0


def test_experiment_plans_keep_invariants():
    points = load_experiment(ROOT / "experiments" / "tiny-3dc.yaml",
                             sweeps=["topology.links.*.latency_ms=1,40"])
    for exp, _ in points:
        for sched in ["dp-wan", "pp-wan", "pp-wan+mtcp", "pp-wan+temporal", "pp-wan+warmup", "atlas"]:
            plan = build_plan(exp, sched)
            tl, _ = simulate(plan)
            tl = tl.repeated(2)
            assert check_timeline(tl, plan) == [], sched


def test_checker_catches_overlap():
    plan = make_plan(pp=2, m=2)
    tl, _ = simulate(plan)
    fwd = [iv for iv in tl.intervals if iv.kind == "fwd" and iv.stage == 1]
    moved = fwd[1]._replace(start_s=fwd[0].start_s)
    tl.intervals[tl.intervals.index(fwd[1])] = moved
    assert any("overlaps" in v or "before" in v for v in check_timeline(tl, plan))


def test_lower_bound_is_each_schedulers_own():
    """Schedulers that place alike but split layers differently (dp-wan even, atlas balanced) do not share a
    lower bound: each row's bound is the one it gets alone, and never above its iteration time."""
    import yaml

    from testbed.runs.simulated import run_point
    from testbed.spec.experiment import Experiment

    spec = yaml.safe_load("""
name: lb
topology:
  name: lb
  tcp_window_mb: 4
  dcs:
  - {name: d0, gpu: A100, gpus: 64, gpus_per_node: 8, intra_gbps: 400}
  - {name: d1, gpu: A100, gpus: 128, gpus_per_node: 8, intra_gbps: 400}
  links:
  - {between: [d0, d1], gbps: 25, latency_ms: 2}
workload: {model: llama3-8b, global_batch: 16, microbatch: 1, seq_len: 4096, tp: 4, pp: 16, dp: 2, schedule: gpipe,
           recompute: full, sequence_parallel: true}
schedulers: [dp-wan, atlas]
iterations: 1
timeline: none
""")
    both = {r.summary["scheduler"]: r.summary for r in run_point(Experiment.model_validate(spec), 0, {}, False)}
    for sched in ("dp-wan", "atlas"):
        alone = run_point(Experiment.model_validate({**spec, "schedulers": [sched]}), 0, {}, False)[0].summary
        assert both[sched]["lower_bound_s"] == alone["lower_bound_s"]
        assert both[sched]["lower_bound_s"] <= both[sched]["iteration_s"] * (1 + 1e-9)

"""The global batch split by each replica's speed (`workload.batch_split: speed`, plan/batch_split.py): a faster
site takes more microbatches, the shares sum to the batch, every share's memory is checked on its site's GPUs, and
both engines' programs run each replica's share."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from testbed.errors import SpecError
from testbed.plan.batch_split import pipeline_s, split_by_speed
from testbed.plan.lower import dry_run, lower
from testbed.program import Forward
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.spec.experiment import Experiment
from testbed.spec.topology import Topology

SMALL = {"name": "small", "layers": 8, "hidden": 256, "heads": 8, "vocab": 1000, "seq_len": 128}
MID = {"name": "mid", "layers": 8, "hidden": 4096, "heads": 32, "vocab": 32000, "seq_len": 4096}
FAMILIES = ("dp-wan", "dp-wan-overlap", "diloco", "streaming-diloco")


def mixed(**workload) -> Experiment:
    """An H100 site and an A100 site (about 3x slower at one MFU), two replicas each."""
    t = Topology(dcs=[{"name": "fast", "gpu": "H100", "gpus": 16}, {"name": "slow", "gpu": "A100", "gpus": 16}],
                 links=[{"between": ["fast", "slow"], "gbps": 100, "latency_ms": 10}])
    w = {"model": SMALL, "global_batch": 24, "tp": 1, "pp": 2, "dp": 4, "batch_split": "speed",
         "replicas_per_dc": {"fast": 2, "slow": 2}, "diloco": {"inner_steps": 4}, **workload}
    return Experiment(topology=t, schedulers=list(FAMILIES), workload=w)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=3), min_size=1, max_size=4),
       st.integers(1, 30))
def test_the_split_sums_to_the_batch_and_its_slowest_replica_is_fastest(stage_s, extra):
    total = len(stage_s) + extra
    got = split_by_speed(total, stage_s)
    assert sum(got) == total and min(got) >= 1
    slowest = max(pipeline_s(t, k) for t, k in zip(stage_s, got, strict=True))
    for other in itertools.product(range(1, total + 1), repeat=len(stage_s)):  # every split, brute force
        if sum(other) == total:
            assert slowest <= max(pipeline_s(t, k) for t, k in zip(stage_s, other, strict=True)) + 1e-9


def test_alike_replicas_split_evenly_and_too_few_microbatches_are_refused():
    assert split_by_speed(12, [[1.0, 2.0]] * 4) == [3, 3, 3, 3]
    assert split_by_speed(7, [[1.0]] * 3) == [3, 2, 2]
    with pytest.raises(ValueError, match="3 microbatches"):
        split_by_speed(3, [[1.0]] * 4)


def test_a_faster_site_takes_a_larger_share_and_the_shares_sum_to_the_batch():
    plan = build_plan(mixed(), "dp-wan")
    fast = [plan.microbatches_of(r) for r in range(plan.dp) if plan.stage_dc[r][0] == "fast"]
    slow = [plan.microbatches_of(r) for r in range(plan.dp) if plan.stage_dc[r][0] == "slow"]
    assert min(fast) > max(slow) >= 1
    assert sum(fast) + sum(slow) == 24 and plan.microbatches == max(fast)
    even = build_plan(mixed(batch_split="even"), "dp-wan")
    assert not even.replica_microbatches and even.microbatches == 6


@pytest.mark.parametrize("scheduler", FAMILIES)
def test_every_replica_runs_its_share_in_the_simulated_programs(scheduler):
    plan = build_plan(mixed(), scheduler)
    progs = lower(plan)
    assert dry_run(progs) == []
    for r in range(plan.dp):
        fwd = {st.microbatch for st in progs[f"s0r{r}"].steps if isinstance(st, Forward)}
        assert len(fwd) == plan.microbatches_of(r) * plan.steps_per_program
    tl, _ = simulate(plan)
    for r in range(plan.dp):
        ran = {iv.microbatch for iv in tl.intervals if iv.replica == r and iv.stage == 0 and iv.kind == "fwd"}
        assert len(ran) == plan.microbatches_of(r) * plan.steps_per_program


def test_the_split_shortens_the_iteration_that_the_slow_site_bounds():
    """With equal shares the A100 site finishes its accumulation last; sharing by speed moves work to the H100s."""
    for s in ("dp-wan", "diloco"):
        even, _ = simulate(build_plan(mixed(batch_split="even"), s))
        speed, _ = simulate(build_plan(mixed(), s))
        assert speed.iteration_s[0] < even.iteration_s[0]


def test_a_share_that_does_not_fit_its_sites_memory_is_one_line_naming_the_field():
    """GPipe holds every microbatch's activations: the H100 site's larger share does not fit where the even
    share does."""
    w = {"model": MID, "global_batch": 40, "pp": 1, "schedule": "gpipe"}
    build_plan(mixed(**w, batch_split="even"), "dp-wan")
    with pytest.raises(SpecError) as e:
        build_plan(mixed(**w), "dp-wan")
    assert e.value.field == "workload.batch_split" and "DC fast" in str(e.value) and "\n" not in str(e.value)
    build_plan(mixed(**{**w, "schedule": "1f1b"}), "dp-wan")  # 1F1B holds one microbatch per stage here


def test_dp_need_not_divide_the_batch_for_data_parallel_families_only():
    exp = mixed(dp=3, replicas_per_dc={"fast": 2, "slow": 1}, global_batch=16)
    plan = build_plan(exp, "dp-wan")
    assert sum(plan.replica_microbatches) == 16
    with pytest.raises(SpecError) as e:
        build_plan(exp, "pp-wan")
    assert e.value.field == "workload.batch_split"
    with pytest.raises(ValidationError, match="batch_split: speed"):
        mixed(dp=3, replicas_per_dc={"fast": 2, "slow": 1}, global_batch=16, batch_split="even")

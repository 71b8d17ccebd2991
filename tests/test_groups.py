"""Hybrids (`workload.groups`, plan/groups.py): a pipeline over each group's DCs, data parallelism or DiLoCo across
the groups, as placements of the data-parallel families lowered by the existing rules."""

from __future__ import annotations

import pytest

from testbed.analysis.wanbytes import wan_bytes
from testbed.errors import SpecError
from testbed.plan.lower import allreduce, dry_run, lower
from testbed.program import OuterSync, Send
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.spec.experiment import Experiment
from testbed.spec.topology import Topology

SMALL = {"name": "small", "layers": 8, "hidden": 256, "heads": 8, "vocab": 1000, "seq_len": 128}
FAMILIES = ("dp-wan", "dp-wan-overlap", "diloco", "streaming-diloco")


def hybrid(**workload) -> Experiment:
    """Group `ab`: a two-stage pipeline from a to b; group `c`: whole pipelines in c."""
    t = Topology(dcs=[{"name": n, "gpu": "H100", "gpus": 16} for n in "abc"],
                 links=[{"between": [x, y], "gbps": 10, "latency_ms": 5} for x, y in ("ab", "bc", "ac")])
    w = {"model": SMALL, "global_batch": 24, "tp": 1, "pp": 2, "dp": 4, "diloco": {"inner_steps": 4},
         "groups": {"ab": ["a", "b"], "c": ["c"]}, **workload}
    return Experiment(topology=t, schedulers=list(FAMILIES), workload=w)


def test_each_group_runs_its_pipeline_and_the_replicas_split_by_room():
    plan = build_plan(hybrid(), "dp-wan")
    assert plan.stage_dc == [["a", "b"]] * 3 + [["c", "c"]]  # rooms 16 and 8 replicas: 4 split 3 + 1
    for s, dcs in ((0, ("a", "c")), (1, ("b", "c"))):  # each stage's all-reduce across the groups' DCs
        ar = allreduce(plan, s)
        assert ar.algorithm == "hierarchical" and len(ar.rings) == 2
        assert [plan.stage_dc[int(g.split("r")[1])][s] for g in (r[0] for r in ar.rings)] == list(dcs)


@pytest.mark.parametrize("scheduler", FAMILIES)
def test_hybrid_programs_fit_together_and_simulate(scheduler):
    plan = build_plan(hybrid(), scheduler)
    progs = lower(plan)
    assert dry_run(progs) == []
    wan = {q.peer for q in progs["s0r0"].pipes if q.wan is not None}
    assert wan == {"s1r0"}  # the group's pipeline crosses a -> b
    assert all(q.wan is None for q in progs["s0r3"].pipes)  # group c's stays inside c
    tl, _ = simulate(plan)
    assert tl.iteration_s[0] > 0


def test_a_diloco_hybrid_sends_activations_every_step_and_syncs_across_groups():
    plan = build_plan(hybrid(), "diloco")
    prog = lower(plan)["s0r0"]
    sends = [st for st in prog.steps if isinstance(st, Send)]
    assert len(sends) == plan.microbatches * plan.diloco.inner_steps  # every inner step's activations cross a -> b
    syncs = [st for st in prog.steps if isinstance(st, OuterSync)]
    assert len(syncs) == 1 and len(syncs[0].rings) == 2  # the outer sync across the two groups
    alone = build_plan(hybrid(groups=None, replicas_per_dc={"a": 3, "c": 1}), "diloco")
    assert wan_bytes(plan) > wan_bytes(alone)  # the same sync, plus the pipeline's messages
    assert plan.token_efficiency == 1.0


def test_bad_groups_are_one_line_naming_the_field():
    cases = [("pp-wan", {}, "pipeline family"),
             ("dp-wan", {"groups": {"ab": ["a", "x"]}}, "unknown DC"),
             ("dp-wan", {"groups": {"ab": ["a", "b"], "bc": ["b", "c"]}}, "two groups"),
             ("dp-wan", {"replicas_per_dc": {"a": 2, "c": 2}}, "replicas_per_dc"),
             ("dp-wan", {"dp": 48, "global_batch": 48}, "not dp=48"),
             ("dp-wan+temporal", {}, "not supported yet")]
    for scheduler, extra, words in cases:
        with pytest.raises(SpecError, match=words) as e:
            build_plan(hybrid(**extra), scheduler)
        assert e.value.field == "workload.groups" and "\n" not in str(e.value)


def test_the_planner_refuses_groups_as_not_yet():
    from testbed.runs.select import search

    with pytest.raises(SpecError, match="chooses the groups itself") as e:
        search(hybrid(), families=["dp-wan"], jobs=1)
    assert e.value.field == "workload.groups"

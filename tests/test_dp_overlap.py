"""Megatron-Core's distributed optimizer as program steps (the `overlap` mechanism, plan/buckets.py): buckets
reduce-scattered while the last backward goes on, parameters all-gathered before the first forward needs them,
one collective at a time per stream; `dp-wan-overlap` is the all-reduce after the last backward, unchanged."""

from __future__ import annotations

import csv
import hashlib
import io
import math
import subprocess
import sys
from collections import defaultdict
from types import SimpleNamespace

import pytest

from testbed.plan.lower import dry_run, lower
from testbed.program import AllGather, AllReduce, Await, Backward, Forward, ReduceScatter
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.spec.load import load_experiment
from testbed.spec.mechanisms import parse_scheduler
from tests.conftest import ROOT

# emu-3dc's model on two layers, one stage, two replicas in each of three DCs: a hierarchical reduce-scatter
SMALL = ["workload.pp=1", "workload.dp=6", "workload.global_batch=6", "workload.model.layers=2"]


def small(*extra: str):
    return load_experiment(ROOT / "experiments" / "emu-3dc.yaml", sets=[*SMALL, *extra])[0][0]


def by_group(tl) -> dict[tuple[int, int], list]:
    out: dict[tuple[int, int], list] = defaultdict(list)
    for iv in tl.intervals:
        out[(iv.stage, iv.replica)].append(iv)
    return out


def test_the_overlap_mechanism_is_dp_wans_default_and_a_modifier_on_any_base():
    assert parse_scheduler("dp-wan").overlap and not parse_scheduler("dp-wan-overlap").overlap
    assert not parse_scheduler("pp-wan").overlap and parse_scheduler("pp-wan+overlap").overlap
    assert parse_scheduler("atlas+overlap").overlap


def test_buckets_follow_the_workload_option_and_megatrons_default():
    plan = build_plan(small("workload.ddp_bucket_params=30000000"), "dp-wan")
    prog = lower(plan)["s0r0"]
    rs = [st for st in prog.steps if isinstance(st, ReduceScatter)]
    assert len(rs) == math.ceil(plan.grad_bytes[0] / (30e6 * 2)) > 1
    assert sum(st.bytes for st in rs) == pytest.approx(plan.grad_bytes[0])
    assert not any(isinstance(st, AllReduce) for st in prog.steps)
    default = build_plan(small(), "dp-wan")
    assert default.bucket_bytes == max(40e6, 1e6 * default.dp) * default.tp * 2


def test_a_bad_bucket_size_is_refused_naming_the_field():
    with pytest.raises(Exception, match="ddp_bucket_params"):
        small("workload.ddp_bucket_params=0")


def test_reduce_scatters_go_inside_the_last_backward_and_all_gathers_first():
    plan = build_plan(small("workload.ddp_bucket_params=30000000"), "dp-wan")
    steps = lower(plan)["s0r0"].steps
    last_bwd = max(i for i, st in enumerate(steps) if isinstance(st, Backward))
    first_fwd = min(i for i, st in enumerate(steps) if isinstance(st, Forward))
    rs = [i for i, st in enumerate(steps) if isinstance(st, ReduceScatter)]
    ag = [i for i, st in enumerate(steps) if isinstance(st, AllGather)]
    assert rs == list(range(last_bwd - len(rs), last_bwd))  # issued as the last backward produces each bucket
    assert ag == list(range(len(ag)))
    afters = [steps[i].after_s for i in rs]
    assert afters == sorted(afters) and afters[0] >= 0 and afters[-1] == pytest.approx(steps[last_bwd].seconds)
    assert len(set(afters)) > 1  # issued through the backward, not all at its start or end
    assert [steps[i].bucket for i in ag] == sorted((steps[i].bucket for i in ag), reverse=True)  # first layers first
    waits = [st for st in steps[first_fwd - len(ag):first_fwd]]
    assert all(isinstance(st, Await) and st.collective == "AllGather" for st in waits)
    assert all(isinstance(st, Await) and st.collective == "ReduceScatter" for st in steps[-len(rs):])


def test_an_overlapped_bucket_starts_before_the_backward_ends_one_at_a_time():
    plan = build_plan(small("workload.ddp_bucket_params=30000000"), "dp-wan")
    tl, _ = simulate(plan)
    for (_s, _r), ivs in by_group(tl).items():
        bwd_end = max(iv.end_s for iv in ivs if iv.kind == "bwd")
        rs = sorted((iv for iv in ivs if iv.kind == "reduce_scatter"), key=lambda iv: iv.microbatch)
        assert len(rs) > 1 and rs[0].start_s < bwd_end
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(rs, rs[1:], strict=False))  # one NCCL stream
        opt = [iv for iv in ivs if iv.kind == "optimizer"]
        assert opt and opt[0].start_s >= rs[-1].end_s - 1e-12  # the optimizer steps on the reduced gradients
        ag = [iv for iv in ivs if iv.kind == "all_gather"]
        first_fwd = min(iv.start_s for iv in ivs if iv.kind == "fwd")
        first_layers = max(ag, key=lambda iv: iv.microbatch)  # the first layers' bucket: needed first
        assert first_fwd >= first_layers.end_s - 1e-12


def test_the_iteration_waits_for_its_reduce_scatters_across_the_wan():
    """Off the WAN (the lower-bound run) the same program ends sooner: the reduce-scatters cross the WAN."""
    plan = build_plan(small(), "dp-wan")
    tl, _ = simulate(plan)
    plan.ideal_wan = True
    ideal, _ = simulate(plan)
    assert ideal.iteration_s[0] < tl.iteration_s[0]


def test_dry_run_accepts_bucketed_programs_and_finds_a_missing_member():
    programs = lower(build_plan(small(), "dp-wan"))
    assert dry_run(programs) == []
    p = programs["s0r1"]
    programs["s0r1"] = p.__class__(**{**p.__dict__, "steps": tuple(st for st in p.steps
                                                                    if not isinstance(st, ReduceScatter))})
    assert any("deadlock" in x for x in dry_run(programs))


def test_workers_open_what_their_peers_accept_for_bucketed_collectives():
    from testbed.runtime.worker import connections_to_accept, connections_to_open

    programs = lower(build_plan(small(), "dp-wan"))
    opened: dict[str, int] = defaultdict(int)
    for p in programs.values():
        for peer, (n, purpose) in connections_to_open(SimpleNamespace(program=p)).items():
            assert purpose == "ring"
            opened[peer] += n
    assert opened
    for g, p in programs.items():
        assert connections_to_accept(SimpleNamespace(program=p)) == opened[g]


# main's dp-wan (the all-reduce after the last backward) on tiny-3dc: its summary.csv, and its timeline.csv's sha256
BEFORE = ROOT / "tests" / "data" / "dp-wan-before-overlap.summary.csv"
BEFORE_TIMELINE_SHA256 = "a3aafe801cb3a039635afbff0fe6e3acab2dfc55ea8d05b016e3a896ff219c0a"


def test_dp_wan_overlap_reproduces_the_old_dp_wan_byte_for_byte(tmp_path):
    r = subprocess.run([sys.executable, "-m", "testbed", "sim", str(ROOT / "experiments" / "tiny-3dc.yaml"),
                        "--set", "schedulers=[dp-wan-overlap]", "--set", "workload.mfu=0.5",  # main's default then
                        "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    summary = (tmp_path / "summary.csv").read_text().replace("dp-wan-overlap", "dp-wan")
    before = list(csv.DictReader(io.StringIO(BEFORE.read_text())))
    after = list(csv.DictReader(io.StringIO(summary)))
    # every column main wrote, byte for byte (columns added since, e.g. the derived mfu, are new outputs)
    assert [{k: row[k] for k in before[0]} for row in after] == before
    timeline = (tmp_path / "timeline.csv").read_text().replace("dp-wan-overlap", "dp-wan")
    assert hashlib.sha256(timeline.encode()).hexdigest() == BEFORE_TIMELINE_SHA256


def test_bucketed_programs_round_trip_through_json():
    from testbed.program import Program

    for p in lower(build_plan(small(), "dp-wan")).values():
        assert Program.from_json(p.to_json()) == p


def test_an_uneven_batch_split_is_refused_naming_the_limit():
    from testbed.errors import SpecError
    from testbed.plan.build import resolve_dp

    exp = load_experiment(ROOT / "experiments" / "tiny-3dc.yaml")[0][0]
    exp = exp.model_copy(update={"workload": exp.workload.model_copy(update={"dp": 3})})
    with pytest.raises(SpecError, match="equal share.*by each site's speed"):
        resolve_dp(exp)


def test_overlapped_timelines_keep_the_timeline_invariants():
    from testbed.analysis.invariants import check_timeline

    for sets in ((), ("workload.ddp_bucket_params=30000000",)):
        plan = build_plan(small(*sets), "dp-wan")
        assert check_timeline(simulate(plan)[0], plan) == []
    plan = build_plan(load_experiment(ROOT / "experiments" / "tiny-3dc.yaml")[0][0], "pp-wan+overlap")
    assert check_timeline(simulate(plan)[0], plan) == []


def test_bubbletea_with_bucketed_collectives_is_refused_as_not_yet():
    with pytest.raises(ValueError, match="not supported yet; add -overlap"):
        parse_scheduler("dp-wan+bubbletea")
    assert parse_scheduler("dp-wan-overlap+bubbletea").bubbletea


def test_the_head_is_reduced_first_the_embedding_last_the_layers_as_the_backward_goes():
    from testbed.plan.buckets import backward_segments, forward_segments, time_at

    bwd = backward_segments(100.0, (20.0, 10.0), 7.0)  # 20 embedding bytes, 10 head bytes, 70 of layers
    assert time_at(bwd, 10.0) == 0.0  # the head's gradients: the backward's first
    assert time_at(bwd, 45.0) == pytest.approx(3.5)  # halfway through the layers
    assert time_at(bwd, 80.0) == pytest.approx(7.0) and time_at(bwd, 100.0) == pytest.approx(7.0)  # embedding last
    fwd = forward_segments(100.0, (20.0, 10.0), 2.0)
    assert time_at(fwd, 20.0) == 0.0 and time_at(fwd, 55.0) == pytest.approx(1.0)
    assert time_at(backward_segments(100.0, (0.0, 0.0), 4.0), 25.0) == pytest.approx(1.0)  # a middle stage


def test_dp_wan_and_dp_wan_overlap_cross_the_wan_in_the_same_ring():
    """One bucket per stage: dp-wan's reduce-scatter is dp-wan-overlap's all-reduce less its all-gather inside the
    DC (sim/wan_ring.py carries both across the WAN), and both grow with the WAN's latency."""
    def durations(latency_ms: float) -> tuple[float, float, float]:
        exp = small("workload.ddp_bucket_params=1000000000000", f"topology.links.*.latency_ms={latency_ms}")
        rs = [iv for iv in simulate(build_plan(exp, "dp-wan"))[0].intervals if iv.kind == "reduce_scatter"]
        ar = [iv for iv in simulate(build_plan(exp, "dp-wan-overlap"))[0].intervals if iv.kind == "allreduce"]
        assert len({iv.microbatch for iv in rs}) == 1
        plan = build_plan(exp, "dp-wan-overlap")
        n = 2  # replicas of the stage in each DC
        gather_s = (n - 1) / n * plan.grad_bytes[0] / min(x.bandwidth_bytes_s for x in plan.intra.values())
        return max(iv.end_s - iv.start_s for iv in rs), max(iv.end_s - iv.start_s for iv in ar), gather_s

    near, far = durations(5.0), durations(40.0)
    for rs_s, ar_s, gather_s in (near, far):
        assert rs_s + gather_s == pytest.approx(ar_s, rel=1e-6)
    assert far[0] > near[0] + 4 * 0.035  # four ring steps, each at least a latency more

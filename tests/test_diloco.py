"""Low-communication training (DiLoCo, Streaming DiLoCo) as lowered programs and in the simulator: an inner
step sends nothing across the WAN, a sync sends its fragment's quantised bytes, streaming's syncs overlap inner
steps and end before the inner step that needs them, effective tokens/s is tokens/s x efficiency, and bad
`workload.diloco` input names its field. `wan_bytes` is checked against the bytes each family puts on the WAN."""

from __future__ import annotations

import dataclasses

import pytest

from testbed.analysis.metrics import summary_row
from testbed.analysis.wanbytes import program_wan_bytes, wan_bytes
from testbed.errors import SpecError
from testbed.plan.lower import dry_run, lower, lower_group
from testbed.program import AllReduce, Forward, OuterSync, OuterWait, Program
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.spec.load import load_experiment
from tests.conftest import ROOT

# one pipeline stage per replica, two replicas in each of three DCs: inner rings of 2, an outer ring of 3 DCs
SETS = ["workload.pp=1", "workload.dp=6", "workload.global_batch=12",
        "workload.model={name: m350, layers: 24, hidden: 1024, heads: 16, vocab: 32000, seq_len: 2048}"]


def experiment(*sets: str):
    return load_experiment(ROOT / "experiments" / "emu-3dc.yaml", sets=[*SETS, *sets])[0][0]


def plan_of(sched: str, *sets: str):
    return build_plan(experiment(*sets), sched)


def test_inner_steps_send_nothing_across_the_wan():
    plan = plan_of("diloco", "workload.diloco.inner_steps=4")
    assert len(plan.dcs_used()) == 3
    for prog in lower(plan).values():
        inner = dataclasses.replace(prog, steps=tuple(st for st in prog.steps if not isinstance(st, OuterSync)))
        assert program_wan_bytes(inner) == 0.0
        assert program_wan_bytes(prog) > 0.0  # the sync does cross it
        (ring,) = next(st for st in prog.steps if isinstance(st, AllReduce)).rings  # the inner all-reduce: the DC's
        assert len(ring) == 2 and all(plan.stage_dc[int(g.split("r")[1])][0] == prog.dc for g in ring)


def test_a_sync_sends_its_fragments_quantised_bytes():
    for bits in (16, 4):
        plan = plan_of("streaming-diloco", "workload.diloco.inner_steps=8", "workload.diloco.fragments=2",
                       f"workload.diloco.outer_bits={bits}")
        prog = lower_group(plan, 0, 0)
        syncs = [st for st in prog.steps if isinstance(st, OuterSync)]
        assert [st.fragment for st in syncs] == [0, 1]
        params = plan.grad_bytes[0] / 2  # bf16 gradients
        assert all(st.bytes == params / 2 * bits / 8 for st in syncs)
        D = len(plan.dcs_used())
        # a hierarchical ring across D DCs puts 2 (D - 1) x bytes on the WAN per sync, over every group
        per_period = sum(program_wan_bytes(p) for p in lower(plan).values())
        assert per_period == pytest.approx(2 * (D - 1) * params * bits / 8)
        assert wan_bytes(plan) == pytest.approx(per_period / 8)


def simulated(sched: str, *sets: str):
    plan = plan_of(sched, *sets)
    tl, _ = simulate(plan)
    return plan, [iv for iv in tl.intervals if iv.gpu == "s0r0"]


def test_streaming_syncs_overlap_inner_steps_and_end_before_they_are_needed():
    plan, ivs = simulated("streaming-diloco", "workload.diloco.inner_steps=8", "workload.diloco.fragments=2",
                          "workload.diloco.overlap_steps=2")
    d, m = plan.diloco, plan.microbatches
    syncs = {iv.microbatch: iv for iv in ivs if iv.kind == "outersync"}
    assert sorted(syncs) == [0, 1]
    for f, iv in syncs.items():
        overlapped = [c for c in ivs if c.kind in ("fwd", "bwd") and c.start_s < iv.end_s and c.end_s > iv.start_s]
        assert overlapped, f"fragment {f}'s sync overlaps no compute"
        after = [c for c in ivs if c.kind == "fwd" and c.microbatch // m == d.wait_before(f)]
        assert all(c.start_s >= iv.end_s - 1e-12 for c in after)  # its next inner step waits for it
        started = [c for c in ivs if c.kind == "fwd" and c.microbatch // m == d.sync_after(f) + 1]
        assert min(c.start_s for c in started) < iv.end_s  # the step after it starts did not wait


def test_each_dc_enters_the_outer_ring_as_its_groups_join():
    """Fragment 0's sync ends at a different time in each DC (the ring's hops differ), so the DCs reach fragment
    1's sync apart: each group's sync starts where it joined (its optimizer step's end), and the DCs that joined
    early have sent their first ring step by the time the last one joins, so every DC's sync ends sooner after the
    last join than fragment 0's, which every DC joined at once, took (a ring started only once all had joined
    would take as long on the same idle links)."""
    plan = plan_of("streaming-diloco", "workload.diloco.inner_steps=8", "workload.diloco.fragments=2")
    tl, _ = simulate(plan)
    d = plan.diloco
    syncs = {(iv.gpu, iv.microbatch): iv for iv in tl.intervals if iv.kind == "outersync"}
    opts: dict[str, list] = {}
    for iv in tl.intervals:
        if iv.kind == "optimizer":
            opts.setdefault(iv.gpu, []).append(iv.end_s)
    groups = sorted({g for g, _ in syncs})
    for g in groups:
        for f in range(d.fragments):
            assert syncs[(g, f)].start_s == pytest.approx(sorted(opts[g])[d.sync_after(f)], abs=1e-12)
    joins = [{syncs[(g, f)].start_s for g in groups} for f in (0, 1)]
    assert len(joins[0]) == 1 and len(joins[1]) == 3  # one DC at once, then three apart
    last = max(joins[1])
    for g in groups:
        took0 = syncs[(g, 0)].end_s - syncs[(g, 0)].start_s
        assert syncs[(g, 1)].end_s - last < took0 - 1e-6


def test_diloco_sync_blocks_and_iteration_is_period_over_h():
    plan, ivs = simulated("diloco", "workload.diloco.inner_steps=4")
    (sync,) = [iv for iv in ivs if iv.kind == "outersync"]
    assert not [c for c in ivs if c.kind in ("fwd", "bwd") and c.start_s < sync.end_s and c.end_s > sync.start_s]
    tl, _ = simulate(plan)
    row = summary_row(plan, tl, 0.0, {})
    assert row["iteration_s"] == pytest.approx(tl.iteration_s[0] / 4, rel=1e-6)
    assert tl.iteration_s[0] >= sync.end_s


def test_effective_tokens_are_tokens_times_efficiency():
    for sched, sets in (("diloco", ["workload.token_efficiency=0.8"]), ("dp-wan", []),
                        ("streaming-diloco", ["workload.diloco.inner_steps=4"])):
        plan = plan_of(sched, "workload.diloco.inner_steps=4", *sets)
        tl, _ = simulate(plan)
        row = summary_row(plan, tl, 0.0, {})
        eff = 0.8 if sets and "0.8" in sets[0] else 1.0
        assert row["token_efficiency"] == eff
        assert row["effective_tokens_per_s"] == pytest.approx(row["tokens_per_s"] * eff, rel=1e-6)


@pytest.mark.parametrize("sched,sets,field", [
    ("diloco", ["workload.diloco.fragments=2"], "workload.diloco.fragments"),
    ("diloco", ["workload.diloco.overlap_steps=1"], "workload.diloco.overlap_steps"),
    ("streaming-diloco", ["workload.diloco.inner_steps=6", "workload.diloco.fragments=4"],
     "workload.diloco.fragments"),
    ("streaming-diloco", ["workload.diloco.inner_steps=8", "workload.diloco.fragments=4",
                          "workload.diloco.overlap_steps=2"], "workload.diloco.overlap_steps"),
    ("diloco", ["workload.diloco.inner_steps=1000"], "workload.token_efficiency"),
    ("streaming-diloco", ["workload.diloco.inner_steps=8", "workload.diloco.outer_bits=2"],
     "workload.token_efficiency"),
])
def test_bad_diloco_input_names_its_field(sched, sets, field):
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        plan_of(sched, *sets)


@pytest.mark.parametrize("bad", ["inner_steps=0", "outer_bits=33", "fragments=0", "steps=3"])
def test_bad_diloco_spec_names_its_field(bad):
    with pytest.raises(SpecError, match=r"workload\.diloco"):
        experiment(f"workload.diloco.{bad}")


def test_default_fragments_fit_inner_steps():
    plan = plan_of("streaming-diloco", "workload.diloco.inner_steps=4")
    assert (plan.diloco.inner_steps, plan.diloco.fragments, plan.diloco.overlap_steps) == (4, 2, 1)
    assert plan_of("streaming-diloco").diloco.fragments == 4  # the published H = 100 takes the default 4


def test_programs_dry_run_and_round_trip():
    plan = plan_of("streaming-diloco", "workload.diloco.inner_steps=4")
    programs = lower(plan)
    assert dry_run(programs) == []
    for p in programs.values():
        assert Program.from_json(p.to_json()) == p
        assert sum(isinstance(st, OuterWait) for st in p.steps) == plan.diloco.fragments
        assert sum(isinstance(st, Forward) for st in p.steps) == 4 * plan.microbatches


def test_wan_bytes_of_synchronous_families():
    exp = load_experiment(ROOT / "experiments" / "emu-3dc.yaml")[0][0]
    pp = build_plan(exp, "pp-wan")  # one stage per DC: every boundary crosses the WAN, both directions
    m = pp.microbatches
    assert wan_bytes(pp) == pytest.approx(pp.dp * m * 2 * sum(pp.act_bytes[:-1]))
    dp = plan_of("dp-wan")
    D = len(dp.dcs_used())
    assert wan_bytes(dp) == pytest.approx(2 * (D - 1) * sum(dp.grad_bytes))
    diloco = plan_of("diloco", "workload.diloco.inner_steps=4")  # the whole model in bf16 once per 4 steps
    assert wan_bytes(diloco) == pytest.approx(wan_bytes(dp) / 4)

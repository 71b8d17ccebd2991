"""Interleaved 1F1B (virtual pipeline stages): the schedule, its lowering, both engines' execution of it,
and the memory it needs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.analysis.invariants import check_timeline
from testbed.errors import SpecError
from testbed.plan.layers import chunk_layers
from testbed.plan.lower import dry_run, lower
from testbed.plan.schedules import Action, build_schedule, interleaved, interleaved_warmup
from testbed.plan.synthetic import make_plan
from testbed.program import Program, Recv, Send
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.spec.load import load_experiment
from tests.conftest import ROOT

LLAMA = ROOT / "experiments" / "llama3-405b-1dc.yaml"


@given(pp=st.integers(2, 6), v=st.integers(2, 4), k=st.integers(1, 4))
def test_each_stage_runs_every_chunk_of_every_microbatch_forward_then_backward(pp, v, k):
    m = k * pp
    for s, acts in enumerate(build_schedule("1f1b", pp, m, v=v)):
        want = sorted((i, c) for i in range(m) for c in range(v))
        assert sorted((a.microbatch, a.chunk) for a in acts if a.op == "F") == want
        assert sorted((a.microbatch, a.chunk) for a in acts if a.op == "B") == want
        for i, c in want:
            assert acts.index(Action("F", i, c)) < acts.index(Action("B", i, c))
        first_b = next(n for n, a in enumerate(acts) if a.op == "B")
        warmup = interleaved_warmup(s, pp, m, v)  # the warm-up, then one forward and one backward in turn
        assert first_b == (warmup + 1 if warmup < m * v else m * v)


def test_megatron_order_groups_pp_microbatches_per_chunk():
    """Forwards go through chunk 0 for pp microbatches, then chunk 1, ...; backwards through the chunks in reverse."""
    acts = interleaved(0, 2, 4, 2)
    fwd = [(a.microbatch, a.chunk) for a in acts if a.op == "F"]
    bwd = [(a.microbatch, a.chunk) for a in acts if a.op == "B"]
    assert fwd == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    assert bwd == [(0, 1), (1, 1), (0, 0), (1, 0), (2, 1), (3, 1), (2, 0), (3, 0)]
    assert interleaved_warmup(0, 2, 4, 2) == 2 * (2 - 0 - 1) + (2 - 1) * 2  # Megatron: 2 (pp - s - 1) + (v - 1) pp


@settings(max_examples=40, deadline=None)
@given(pp=st.integers(2, 6), v=st.integers(2, 4), k=st.integers(1, 3))
def test_bubble_shrinks_to_pp_minus_1_over_v_slots(pp, v, k):
    """Equal stages, free communication: the iteration is m + (pp - 1) / v slots of one microbatch's compute
    (Narayanan et al. 2021): the bubble of plain 1F1B divided by v."""
    m, f, b = k * pp, 1.0, 2.0
    slot = f + b

    def bubble_slots(vs: int) -> float:
        tl, _ = simulate(make_plan(pp=pp, m=m, f=f, b=b, virtual_stages=vs))
        return tl.iteration_s[0] / slot - m

    plain, inter = bubble_slots(1), bubble_slots(v)
    assert plain == pytest.approx(pp - 1)
    assert inter == pytest.approx((pp - 1) / v)
    assert inter < plain


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(2, 6), v=st.integers(2, 5), k=st.integers(1, 4), dp=st.integers(1, 3), split=st.integers(0, 6),
       temporal=st.booleans(), latency=st.sampled_from([0.0, 0.004, 0.03]))
def test_random_interleaved_plans_lower_without_deadlock_and_keep_invariants(pp, v, k, dp, split, temporal, latency):
    dcs = ["a" if s < min(split, pp) else "b" for s in range(pp)]
    plan = make_plan(pp=pp, dp=dp, m=k * pp, f=0.01, b=0.02, dcs=dcs, act_bytes=2e6, grad_bytes=1e7, capacity=1e9,
                     latency=latency, window=2**20, temporal=temporal, intra_bw=1e10, virtual_stages=v)
    programs = lower(plan)
    assert dry_run(programs) == []
    tl, _ = simulate(plan)
    assert check_timeline(tl, plan) == []


def test_dry_run_catches_a_chunk_sent_to_the_wrong_chunk():
    plan = make_plan(pp=2, m=2, virtual_stages=2, act_bytes=1.0)
    progs = lower(plan)
    p = progs["s1r0"]
    i = next(n for n, s in enumerate(p.steps) if isinstance(s, Send) and s.kind == "a" and s.chunk == 1)
    bad = p.steps[i].__class__(**{**p.steps[i].__dict__, "chunk": 0})
    progs["s1r0"] = Program(**{**p.__dict__, "steps": p.steps[:i] + (bad,) + p.steps[i + 1:]})
    assert any("chunk" in x for x in dry_run(progs))


def test_last_stage_sends_to_the_first_over_the_wan_and_it_costs_its_latency():
    """Chunk c of the last stage feeds chunk c + 1 of the first: across DCs on the WAN pipe between them."""
    dcs = ["a", "a", "b", "b"]
    plan = make_plan(pp=4, m=4, f=0.01, b=0.02, dcs=dcs, act_bytes=1e3, capacity=1e12, latency=0.05, virtual_stages=2)
    p3 = lower(plan)["s3r0"]
    wrap = [s for s in p3.steps if isinstance(s, Send) and s.peer == "s0r0"]
    assert wrap and all(s.kind == "a" and s.chunk == 1 for s in wrap)
    assert p3.pipe("s0r0").wan == ("b", "a")
    p0 = lower(plan)["s0r0"]
    assert any(isinstance(s, Recv) and s.peer == "s3r0" and s.kind == "a" for s in p0.steps)
    near = make_plan(pp=4, m=4, f=0.01, b=0.02, dcs=dcs, act_bytes=1e3, capacity=1e12, latency=0.0, virtual_stages=2)
    slow, fast = simulate(plan)[0].iteration_s[0], simulate(near)[0].iteration_s[0]
    # microbatch 0's own chain crosses the WAN v times at the a-b boundary and v - 1 times at the wrap, each way
    v = 2
    assert slow - fast >= 2 * 0.05 * (v + v - 1) - 1e-9


def test_programs_with_chunks_survive_json():
    plan = make_plan(pp=3, m=3, virtual_stages=2, act_bytes=5.0)
    for p in lower(plan).values():
        assert Program.from_json(p.to_json()) == p


def test_microbatches_not_a_multiple_of_pp_are_refused_naming_the_field():
    (exp, _), = load_experiment(ROOT / "experiments" / "tiny-3dc.yaml",
                                sets=["workload.virtual_stages=2", "workload.global_batch=20", "workload.dp=2"])
    with pytest.raises(SpecError, match=r"^workload\.virtual_stages: 10 microbatches .* multiple of pp=3"):
        build_plan(exp, "pp-wan")
    with pytest.raises(ValueError, match="virtual_stages"):
        load_experiment(ROOT / "experiments" / "tiny-3dc.yaml",
                        sets=["workload.virtual_stages=2", "workload.schedule=gpipe"])


def test_first_chunk_holds_only_the_embedding_and_last_only_the_head():
    """126 layers over 16 stages leave 7 on each end stage: with 8 chunks, one layer each, the first stage's first
    chunk and the last stage's last are empty (the embedding's and the output head's), as in Llama 3."""
    from testbed.costs.stage import split_layers

    chunks = chunk_layers(split_layers(126, 16), 8)
    assert chunks[0] == [0] + [1] * 7 and chunks[-1] == [1] * 7 + [0]
    assert all(row == [1] * 8 for row in chunks[1:-1])
    assert sum(map(sum, chunks)) == 126


def test_llama3_405b_layout_fits_with_sequence_parallelism_on_by_default():
    published = ["workload.virtual_stages=1", "workload.recompute=selective"]
    (exp, _), = load_experiment(LLAMA, sets=published)
    assert exp.workload.sequence_parallel is None and exp.workload.sequence_parallel_at()
    plan = build_plan(exp, "pp-wan")
    assert max(plan.mem_gb) <= 80
    (off, _), = load_experiment(LLAMA, sets=[*published, "workload.sequence_parallel=false"])
    with pytest.raises(SpecError, match="needs .* GB per H100"):
        build_plan(off, "pp-wan")


def test_interleaving_holds_more_in_flight_than_1f1b_and_full_recompute_fits_it():
    """Megatron's interleaved warm-up keeps (2 (pp - s - 1) + (v - 1) pp + 1) / v stage-microbatches on stage s,
    more than 1F1B's pp - s on later stages; with full recomputation the published v fits in 80 GB."""
    from testbed.costs.stage import in_flight

    assert all(in_flight(s, 16, 32, "1f1b", 8) >= in_flight(s, 16, 32, "1f1b") for s in range(16))
    assert in_flight(15, 16, 32, "1f1b", 8) > in_flight(15, 16, 32, "1f1b")
    (exp, _), = load_experiment(LLAMA)  # as shipped: V = 8, full recomputation
    plan = build_plan(exp, "pp-wan")
    assert plan.virtual_stages == 8 and max(plan.mem_gb) <= 80
    assert plan.chunk_layers[0][0] == 0 and plan.chunk_layers[-1][-1] == 0
    # a chunk's time is its layers' (the head's on the last stage's last chunk): the stage's time over its chunks
    assert sum(plan.chunk_fwd_s[0][5]) == pytest.approx(plan.fwd_s[0][5])
    assert sum(plan.chunk_bwd_s[0][15]) == pytest.approx(plan.bwd_s[0][15])


def test_the_realised_engine_runs_interleaved_programs_as_the_simulator_does():
    """BubbleTea's realised iterations (testbed/sim/realised.py) execute the same compiled steps: without noise
    they end when the simulator's do, across DCs too; with noise they move, seeded."""
    from testbed.sim.realised import Jitter, realise

    plan = make_plan(pp=4, dp=2, m=8, f=0.01, b=0.02, dcs=["a", "a", "b", "b"], act_bytes=2e6, capacity=1e9,
                     latency=0.01, window=2**20, intra_bw=1e10, virtual_stages=2)
    exact = simulate(plan)[0].iteration_s[0]
    assert realise(plan, Jitter(3, 0.0, 0.0)).timeline.iteration_s[0] == pytest.approx(exact)
    a, b = (realise(plan, Jitter(3, 0.1, 0.1)).timeline.iteration_s[0] for _ in range(2))
    assert a == b != exact


def test_what_the_workers_cannot_run_yet_is_refused_before_anything_starts():
    from testbed.errors import NotYetError
    from testbed.runs.emulated import check_programs

    (exp, _), = load_experiment(ROOT / "experiments" / "emu-3dc.yaml",
                                sets=["workload.virtual_stages=2", "workload.global_batch=12"])
    plan = build_plan(exp, "pp-wan")
    check_programs(plan, "modeled")  # the modeled workers run it (tests/integration/test_interleaved_emulation.py)
    with pytest.raises(NotYetError, match="torch compute with virtual_stages=2"):
        check_programs(plan, "torch")
    with pytest.raises(NotYetError, match="BubbleTea with virtual_stages=2"):
        check_programs(build_plan(exp, "pp-wan+bubbletea"), "modeled")


def test_the_planner_estimates_the_published_layout_as_the_simulator_runs_it():
    from testbed.costs.models import resolve_model
    from testbed.plan.estimate import Estimator, Layout
    from testbed.sim.executor import simulate
    from testbed.spec.mechanisms import parse_scheduler

    (exp, _), = load_experiment(LLAMA)
    w = exp.workload
    plan = build_plan(exp, "atlas")
    est = Estimator(exp, resolve_model(w.model), parse_scheduler("atlas"))(
        Layout((plan.stage_dc[0][0],), (w.pp,), w.tp, w.pp, w.dp, w.microbatch))
    assert est.layers == plan.layers
    # chunks taken as equal v-ths of a stage (the end stages hold a layer fewer): within 2 %
    assert est.iteration_s == pytest.approx(simulate(plan)[0].iteration_s[0], rel=0.02)

"""BubbleTea's fill work (testbed/bubbletea/fill.py): jobs without a latency SLO in what training and prefill leave.
Fill never moves training or prefill, never overlaps them or the guard band, is preempted at layer boundaries,
and serves the earliest deadline first."""

from __future__ import annotations

import pytest

from testbed.analysis.invariants import check_timeline
from testbed.bubbletea.fill import FillJob, fill_metrics, run_fill, trace_jobs
from testbed.bubbletea.run import run_bubbletea, train_mfu
from testbed.costs.prefill import inference_model
from testbed.costs.prefill_model import prefill_time_s
from testbed.errors import NotYetError, SpecError
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.spec.experiment import FillOptions
from testbed.spec.load import load_experiment
from testbed.timeline import Interval, Timeline
from tests.conftest import ROOT

EXP = ROOT / "experiments" / "emu-bubbletea.yaml"
SCHED = "atlas+bubbletea"


def _exp(*sets: str):
    (exp, _), = load_experiment(EXP, sets=[f"schedulers=[{SCHED}]", "iterations=3", "bubbletea.rate_scale=20",
                                           *sets])
    return exp


def _run(exp):
    plan = build_plan(exp, SCHED)
    tl, _ = simulate(plan)
    res = run_bubbletea(plan, tl.repeated(exp.iterations), exp.bubbletea, exp.seed,
                        train_mfu(exp.workload.mfu, plan.tp, plan))
    return plan, res


@pytest.fixture(scope="module")
def with_and_without():
    return _run(_exp()), _run(_exp("bubbletea.fill.jobs_per_s=40"))


def test_fill_moves_neither_training_nor_prefill(with_and_without):
    (_, bare), (_, filled) = with_and_without
    keep = ("fwd", "bwd", "allreduce", "optimizer", "send", "recv", "prefill")
    assert [iv for iv in bare.timeline.intervals if iv.kind in keep] == \
        [iv for iv in filled.timeline.intervals if iv.kind in keep]
    assert [(p.request.request_id, p.fallback, p.end_s) for p in bare.placements] == \
        [(p.request.request_id, p.fallback, p.end_s) for p in filled.placements]
    assert bare.metrics["train_slowdown"] == filled.metrics["train_slowdown"]
    assert bare.metrics["slo_attainment"] == filled.metrics["slo_attainment"]
    assert filled.metrics["fill_util"] > 0 and "fill_util" not in bare.metrics


def test_fill_keeps_the_guard_band_and_overlaps_nothing(with_and_without):
    (_, _), (plan, filled) = with_and_without
    assert check_timeline(filled.timeline, plan) == []
    guard = _exp().bubbletea.guard_ms / 1e3
    busy: dict[tuple, list[tuple[float, float]]] = {}
    for iv in filled.timeline.intervals:
        if iv.kind in ("fwd", "bwd", "allreduce", "optimizer", "prefill"):
            busy.setdefault((iv.stage, iv.replica), []).append((iv.start_s, iv.end_s))
    fills = [iv for iv in filled.timeline.intervals if iv.kind == "fill"]
    assert fills
    for f in fills:
        for a, b in busy[(f.stage, f.replica)]:
            assert f.end_s <= a - guard + 1e-9 or f.start_s >= b + guard - 1e-9, (f, a, b)


def test_fill_is_a_spec_error_with_noise_and_not_yet_emulated():
    with pytest.raises(SpecError, match="fill: not yet with timing noise"):
        _exp("bubbletea.fill.jobs_per_s=1", "bubbletea.jitter_compute_cv=0.05")
    from testbed.runs.emulated import check_emulable

    with pytest.raises(NotYetError, match="bubbletea.fill"):
        check_emulable(_exp("bubbletea.fill.jobs_per_s=1"))


def _one_group(plan, gaps: list[tuple[float, float]], end_s: float) -> Timeline:
    """A timeline of group s0r0 busy (fwd) everywhere but `gaps`."""
    dc = plan.stage_dc[0][0]
    ivs, t = [], 0.0
    for a, b in gaps:
        if a > t:
            ivs.append(Interval(0, "s0r0", dc, 0, 0, "fwd", 0, t, a, 0.0))
        t = b
    ivs.append(Interval(0, "s0r0", dc, 0, 0, "fwd", 0, t, end_s, 0.0))
    return Timeline("t", "sim", ivs, [end_s], 1)


def _step_s(plan, opts: FillOptions) -> float:
    model = inference_model(opts.model)
    return prefill_time_s(model, plan.gpu_types[plan.stage_dc[0][0]], plan.tp, opts.seq_len, opts.batch) / model.layers


def test_a_pass_is_preempted_at_layer_boundaries_and_resumes_on_its_group():
    plan = build_plan(_exp(), SCHED)
    opts = FillOptions(batch=1, seq_len=128, passes=1)
    step = _step_s(plan, opts)
    layers = inference_model(opts.model).layers
    # two windows of 2.5 and then enough layers: the first holds 2 whole layers, the second the rest
    gaps = [(0.0, 2.5 * step), (10 * step, (12 + layers) * step)]
    tl = _one_group(plan, gaps, (20 + layers) * step)
    job = FillJob(0, 0.0, 1, 128, 1, 1e9)
    out = run_fill(plan, tl, opts, [job], 0.0, {0: True})
    assert [round((iv.end_s - iv.start_s) / step, 6) for iv in out.intervals] == [2.0, layers - 2.0]
    assert out.intervals[1].start_s == pytest.approx(10 * step)
    assert out.done_s[0] == pytest.approx((10 + layers - 2) * step)


def test_a_window_shorter_than_a_layer_and_the_guard_band_runs_nothing():
    plan = build_plan(_exp(), SCHED)
    opts = FillOptions(batch=1, seq_len=128, passes=1)
    step = _step_s(plan, opts)
    guard = step
    tl = _one_group(plan, [(0.0, 2.9 * step)], 5 * step)  # 2.9 - 2 guards = 0.9 of a layer
    assert run_fill(plan, tl, opts, [FillJob(0, 0.0, 1, 128, 1, 1e9)], guard, {0: True}).intervals == []
    tl = _one_group(plan, [(0.0, 3.1 * step)], 5 * step)
    (iv,) = run_fill(plan, tl, opts, [FillJob(0, 0.0, 1, 128, 1, 1e9)], guard, {0: True}).intervals
    assert iv.start_s == pytest.approx(guard) and iv.end_s <= 3.1 * step - guard + 1e-12


def test_earliest_deadline_first_and_late_jobs_are_not_started():
    plan = build_plan(_exp(), SCHED)
    opts = FillOptions(batch=1, seq_len=128, passes=1)
    step = _step_s(plan, opts)
    layers = inference_model(opts.model).layers
    tl = _one_group(plan, [(0.0, 3 * layers * step)], 4 * layers * step)
    late = FillJob(0, 0.0, 1, 128, 1, 0.0 + 1e-12)  # due before anything can run
    loose, tight = FillJob(1, 0.0, 1, 128, 1, 1e9), FillJob(2, 0.0, 1, 128, 1, 2 * layers * step)
    out = run_fill(plan, tl, opts, [late, loose, tight], 0.0, {0: True})
    assert [iv.microbatch for iv in out.intervals] == [2, 1]  # the tighter deadline first, the late one never
    m = fill_metrics(out, 4 * layers * step, 1, plan.tp, 0.5)
    assert (m["fill_jobs"], m["fill_jobs_met"], m["fill_jobs_open"]) == (3, 2, 0)
    assert m["fill_deadline_met"] == pytest.approx(2 / 3)


def test_a_stage_without_memory_for_fill_runs_none():
    plan = build_plan(_exp(), SCHED)
    opts = FillOptions(batch=1, seq_len=128, passes=1)
    tl = _one_group(plan, [(0.0, 1.0)], 2.0)
    assert run_fill(plan, tl, opts, [FillJob(0, 0.0, 1, 128, 1, 1e9)], 0.0, {0: False}).intervals == []


def test_a_fill_trace_is_read_and_a_bad_row_names_its_line(tmp_path):
    good = tmp_path / "jobs.csv"
    good.write_text("arrival_s,batch,seq_len,passes,deadline_s\n2.0,4,256,3,10\n0.5,1,64,1,1\n99,1,1,1,1\n")
    jobs = trace_jobs(good, 50.0)
    assert [(j.arrival_s, j.batch, j.seq_len, j.passes, j.deadline_s) for j in jobs] == [
        (0.5, 1, 64, 1, 1.5), (2.0, 4, 256, 3, 12.0)]
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,batch,seq_len,passes,deadline_s\n1,1,1,1,1\n1,x,1,1,1\n")
    with pytest.raises(SpecError, match="line 3"):
        trace_jobs(bad, 50.0)
    with pytest.raises(SpecError, match="lacks the column"):
        (tmp_path / "cols.csv").write_text("arrival_s,batch\n1,1\n")
        trace_jobs(tmp_path / "cols.csv", 50.0)


def test_the_knee_comparison_flags_whatever_fill_moved():
    from bench.bubbletea_fill_knee import compare

    base = {"knee_request_rate": "144.5", "goodput_rps": "144.4", "slo_attainment": "0.998", "train_slowdown": "0.0",
            "served_in_bubbles": "0.89", "gpu_util": "0.86", "useful_util": "0.806"}
    fill = {**base, "gpu_util": "0.95", "useful_util": "0.827", "fill_util": "0.09", "fill_goodput_jobs_per_s": "4.1",
            "fill_goodput_tokens_per_s": "270000", "fill_deadline_met": "1.0"}
    key = ("atlas+bubbletea", "sim")
    lines, moved = compare({key: base}, {key: fill})
    assert moved == [] and "86.0 % -> 95.0 %" in lines[-1]
    _, moved = compare({key: base}, {key: {**fill, "slo_attainment": "0.97"}})
    assert moved == ["atlas+bubbletea: slo_attainment 0.998 -> 0.97"]


def test_the_knee_carries_fill_columns_only_when_the_sweep_has_fill_work():
    from testbed.bubbletea.knee import KNEE_FILL_COLUMNS, KNEE_HEADER, knee_header, knees

    row = {"scheduler": "atlas+bubbletea", "source": "sim", "requests": 10, "request_rate": 5.0, "sweep": "",
           "gpu_util": 0.9, "useful_util": 0.8, "goodput_rps": 5.0, "slo_attainment": 1.0, "train_slowdown": 0.0,
           "served_in_bubbles": 0.9}
    assert knee_header([row]) == KNEE_HEADER
    filled = {**row, **{c: 0.1 for c in KNEE_FILL_COLUMNS}}
    header = knee_header([filled])
    assert header == KNEE_HEADER + KNEE_FILL_COLUMNS
    (out,) = knees([filled], extra=header[len(KNEE_HEADER):])
    assert len(out) == len(header) and out[-len(KNEE_FILL_COLUMNS):] == (0.1,) * len(KNEE_FILL_COLUMNS)
    late = {**filled, "slo_attainment": 0.5}  # no knee: its fill columns are empty too
    (none,) = knees([late], extra=header[len(KNEE_HEADER):])
    assert none[2] == "" and none[-len(KNEE_FILL_COLUMNS):] == ("",) * len(KNEE_FILL_COLUMNS)

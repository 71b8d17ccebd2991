"""BubbleTea: traces, the prefill model, and what the scheduler must never do."""

from __future__ import annotations

import statistics

import pytest

from testbed.analysis.invariants import check_timeline
from testbed.bubbletea.bubbles import extract_bubbles
from testbed.bubbletea.run import run_bubbletea
from testbed.bubbletea.trace import load_trace, synthetic_trace
from testbed.costs.models import MODELS
from testbed.costs.prefill import (
    chunk_time_s,
    coverage,
    kv_bytes_per_token,
    load_perf_rows,
    prefill_time_s,
    relative_errors,
)
from testbed.errors import SpecError
from testbed.plan.build import build_plan
from testbed.sim.executor import simulate
from testbed.spec.load import load_experiment
from tests.conftest import ROOT, SHARED_DATA

PERF = SHARED_DATA / "splitwise-perf-model" / "perf_model.csv"
CONV = SHARED_DATA / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv"


def test_trace_loader_azure_format(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,109\n2023-11-16 18:15:51.2224670,879,55\n")
    reqs = load_trace(f)
    assert [r.prompt_tokens for r in reqs] == [374, 396, 879]
    assert reqs[0].arrival_s == 0 and reqs[1].arrival_s == pytest.approx(4.314579)
    fast = load_trace(f, rate_scale=2.0)
    assert fast[1].arrival_s == pytest.approx(reqs[1].arrival_s / 2)
    assert len(load_trace(f, start_s=1.0, duration_s=10)) == 2


@pytest.mark.parametrize(("body", "line", "words"), [
    ("1.0,10,5\n2.0,x,5\n", 3, "unreadable"),
    ("1.0,10,5\n0.5,10,5\n", 3, "backwards"),
    ("1.0,0,5\n", 2, "ContextTokens=0"),
])
def test_trace_bad_rows_name_the_line(tmp_path, body, line, words):
    f = tmp_path / "bad.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + body)
    with pytest.raises(SpecError) as e:
        load_trace(f)
    assert str(e.value).startswith(f"{f}:{line}") and words in str(e.value)


def test_synthetic_trace_matches_azure_conversation_statistics():
    a = synthetic_trace(400, seed=3)
    assert a == synthetic_trace(400, seed=3)
    assert len(a) / 400 == pytest.approx(5.53, rel=0.1)
    assert statistics.median(r.prompt_tokens for r in a) == pytest.approx(1020, rel=0.12)
    assert len(synthetic_trace(100, rate_scale=10, seed=3)) / 100 == pytest.approx(55.3, rel=0.1)


def test_shipped_trace_loads():
    reqs = load_trace(ROOT / "traces" / "synthetic-conv-2min.csv")
    assert len(reqs) > 500 and all(r.prompt_tokens > 0 for r in reqs)


def test_prefill_model_shape():
    m = MODELS["llama2-70b"]
    ts = [prefill_time_s(m, "H100", 8, n) for n in (128, 512, 2048, 8192)]
    assert ts == sorted(ts) and ts[-1] > 3 * ts[1]
    whole = prefill_time_s(m, "H100", 8, 4096)
    chunks = chunk_time_s(m, "H100", 8, 0, 2048) + chunk_time_s(m, "H100", 8, 2048, 2048)
    assert whole < chunks < whole * 1.2  # chunking costs one more pass's overhead, not more FLOPs
    assert coverage("H200", 8) == (("H100", 8), False) and coverage("A100", 4) == (("A100", 4), True)
    assert coverage("H100", 1)[0] == ("H100", 4)
    assert kv_bytes_per_token(MODELS["llama2-7b"]) == 2 * 32 * 32 * 128 * 2


@pytest.mark.skipif(not PERF.exists(), reason=f"{PERF} not present")
def test_prefill_model_error_on_measured_data():
    errs = relative_errors(load_perf_rows(PERF))
    assert len(errs) == 630
    assert statistics.median(e["rel_err"] for e in errs) <= 0.10


def _bubbletea_run(sets: list[str]):
    (exp, _), = load_experiment(ROOT / "experiments" / "bubbletea-3dc.yaml", sets=sets)
    plan = build_plan(exp, "atlas+bubbletea")
    tl, _ = simulate(plan)
    tl = tl.repeated(exp.iterations)
    return exp, plan, tl, run_bubbletea(plan, tl, exp.bubbletea, exp.seed)


@pytest.mark.parametrize("rate", [20.0, 300.0])
def test_bubbletea_never_touches_training(rate):
    exp, plan, base, res = _bubbletea_run(["sweep={}", "bubbletea.trace=synthetic", f"bubbletea.rate_scale={rate}",
                                           "iterations=2"])
    tl = res.timeline
    assert check_timeline(tl, plan) == []  # no prefill overlaps a training op on the same group
    train = sorted(iv for iv in tl.intervals if iv.kind in ("fwd", "bwd", "allreduce", "send", "recv"))
    assert train == sorted(iv for iv in base.intervals if iv.kind in ("fwd", "bwd", "allreduce", "send", "recv"))
    guard = exp.bubbletea.guard_ms / 1e3
    bubbles = {}
    for b in extract_bubbles(base):
        bubbles.setdefault((b.stage, b.replica), []).append(b)
    prefill = [iv for iv in tl.intervals if iv.kind == "prefill"]
    assert prefill
    for iv in prefill:  # inside one bubble, a guard band away from both of its ends
        assert any(b.start_s + guard - 1e-9 <= iv.start_s and iv.end_s <= b.end_s - guard + 1e-9
                   for b in bubbles[(iv.stage, iv.replica)]), iv
    served = sum(not p.fallback for p in res.placements)
    assert served + res.metrics["fallback"] == res.metrics["requests"] == len(res.placements) > 0
    for p in res.placements:
        assert p.fallback == (p.gpu == "fallback") and p.ttft_s > 0
        if not p.fallback:
            assert p.ttft_s <= exp.bubbletea.ttft_slo_ms / 1e3 + 1e-9


def test_summary_reports_zero_training_slowdown(tmp_path):
    from testbed.sim.run import run_experiment

    pts = load_experiment(ROOT / "experiments" / "bubbletea-3dc.yaml",
                          sets=["bubbletea.trace=synthetic", "bubbletea.rate_scale=50", "sweep={}",
                                "schedulers=[atlas, atlas+bubbletea]"])
    rows = {r.summary["scheduler"]: r.summary for r in run_experiment(pts)}
    bt, base = rows["atlas+bubbletea"], rows["atlas"]
    assert bt["train_slowdown"] == 0.0 and bt["iteration_s"] == base["iteration_s"]
    assert bt["train_util"] == base["train_util"] and bt["gpu_util"] > base["gpu_util"]
    assert base["requests"] == "" and bt["requests"] > 0


@pytest.mark.skipif(not CONV.exists(), reason=f"{CONV} not present")
def test_saturated_bubbles_reach_90_percent_utilization():
    from testbed.sim.run import run_experiment

    pts = load_experiment(ROOT / "experiments" / "bubbletea-3dc.yaml",
                          sets=["sweep={}", "bubbletea.rate_scale=200", "schedulers=[atlas+bubbletea]",
                                "timeline=none"])
    row = run_experiment(pts)[0].summary
    assert row["gpu_util"] >= 0.90, row
    assert row["ttft_p99_ms"] <= 2000 + 1e-6

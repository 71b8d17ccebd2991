"""Mechanisms of the operator compute model (testbed/costs/operators.py), never a published value."""

import itertools

import pytest

from testbed.costs import gpu_specs
from testbed.costs.gpus import GPUS
from testbed.costs.models import MODELS
from testbed.costs.operators import (
    allreduce_s,
    attention_eff,
    attention_flops,
    attention_s,
    gemm_roofline_s,
    gemm_s,
    layer_times,
)
from testbed.costs.published import Row, iteration_s
from testbed.costs.stage import layer_costs
from testbed.errors import SpecError

ZOO = ["A100", "A100-40", "H100", "H100-PCIE", "H200", "B200", "MI300X"]
SIZES = [1, 7, 64, 128, 1000, 2048, 4096, 8192, 53248]


@pytest.mark.parametrize("gpu", ZOO)
def test_a_gemm_never_beats_its_roofline(gpu):
    for m, n, k in itertools.product(SIZES, repeat=3):
        assert gemm_s(m, n, k, gpu) >= gemm_roofline_s(m, n, k, GPUS[gpu]), (m, n, k)


@pytest.mark.parametrize("gpu", ZOO)
def test_gemm_efficiency_rises_with_the_reduction_length(gpu):
    for m, n in [(128, 128), (4096, 4096), (8192, 1280)]:
        eff = [2 * m * n * k / gemm_s(m, n, k, gpu) for k in (64, 256, 1024, 4096, 16384, 65536)]
        assert eff == sorted(eff), (m, n)


def test_a_small_gemm_is_memory_bound_and_a_large_one_compute_bound():
    g = GPUS["H100"]
    small, large = (8, 8192, 8192), (8192, 8192, 8192)
    assert gemm_s(*small, "H100") >= BF16_BYTES(*small) / g.hbm_bytes_per_s
    assert 2 * 8 * 8192 * 8192 / gemm_s(*small, "H100") < 0.1 * g.peak_tflops * 1e12
    assert 2 * 8192 ** 3 / gemm_s(*large, "H100") > 0.5 * g.peak_tflops * 1e12


def BF16_BYTES(m, n, k):  # noqa: N802 - reads as the formula
    return 2 * (m * k + k * n + m * n)


def test_wave_quantisation_a_tile_past_a_full_wave_costs_a_wave():
    spec = gpu_specs.compute_spec("A100")  # 128x128 tiles on 108 SMs
    full = gemm_s(128 * 108, 128, 4096, "A100")
    over = gemm_s(128 * 108 + 1, 128, 4096, "A100")
    assert spec.sms == 108 and over > 1.5 * full


@pytest.mark.parametrize("gpu", ZOO)
def test_attention_efficiency_rises_with_sequence_and_head_dim(gpu):
    spec = gpu_specs.compute_spec(gpu)
    for bwd in (False, True):
        by_seq = [attention_eff(s, 128, spec, bwd) for s in (128, 512, 2048, 8192, 32768)]
        by_dim = [attention_eff(4096, d, spec, bwd) for d in (64, 128, 256)]
        assert by_seq == sorted(by_seq) and by_dim == sorted(by_dim)
        assert all(0 < e <= 1 for e in by_seq + by_dim)
    # never faster than its FLOPs at peak
    assert attention_s(1, 8192, 8, 128, gpu) > attention_flops(1, 8192, 8, 128) / (GPUS[gpu].peak_tflops * 1e12)


@pytest.mark.parametrize("gpu", ZOO)
def test_a_larger_tp_never_reduces_nvlink_time(gpu):
    for nbytes in (1e3, 1e6, 64e6):
        times = [allreduce_s(nbytes, tp, gpu) for tp in (1, 2, 4, 8, 16)]
        assert times == sorted(times) and times[0] == 0.0
    per_layer = [layer_times(MODELS["llama3-70b"], gpu, tp=tp, microbatch=1, recompute="none").parts["comm"]
                 for tp in (1, 2, 4, 8)]
    assert per_layer == sorted(per_layer)


@pytest.mark.parametrize("model", ["gpt3-175b", "llama3-8b", "llama3-70b"])
def test_full_recompute_costs_exactly_one_more_forward(model):
    kw = {"tp": 8, "microbatch": 1, "sequence_parallel": True}
    none = layer_times(MODELS[model], "H100", recompute="none", **kw)
    full = layer_times(MODELS[model], "H100", recompute="full", **kw)
    sel = layer_times(MODELS[model], "H100", recompute="selective", **kw)
    assert full.bwd_s == pytest.approx(none.bwd_s + none.fwd_s, rel=1e-12)
    assert full.fwd_s == none.fwd_s and sel.bwd_s == none.bwd_s  # FlashAttention already recomputes attention


def test_sequence_parallelism_shrinks_only_memory_bound_work():
    m = MODELS["llama3-70b"]
    sp = layer_times(m, "H100", tp=8, microbatch=1, recompute="none", sequence_parallel=True)
    no = layer_times(m, "H100", tp=8, microbatch=1, recompute="none", sequence_parallel=False)
    assert sp.parts["memory"] < no.parts["memory"]
    assert (sp.parts["gemm"], sp.parts["attention"], sp.parts["comm"]) == (
        no.parts["gemm"], no.parts["attention"], no.parts["comm"])


def test_mfu_auto_takes_layer_times_from_operators_and_typed_mfu_stays_as_it_was():
    m = MODELS["gpt3-175b"]
    kw = {"tp": 8, "dp": 4, "microbatch": 1, "recompute": "selective", "distributed_optimizer": True}
    auto = layer_costs(m, "A100", mfu="auto", **kw)
    ops = layer_times(m, "A100", tp=8, microbatch=1, recompute="selective")
    assert (auto.fwd_s, auto.bwd_s, auto.head_fwd_s) == (ops.fwd_s, ops.bwd_s, ops.head_fwd_s)
    typed = layer_costs(m, "A100", mfu=0.5, **kw)
    assert typed.bwd_s == pytest.approx(2 * typed.fwd_s - typed.tp_comm_s / 2, rel=1e-12)  # 2x compute, same comm
    # a faster GPU is never slower on the same layer
    assert layer_costs(m, "H100", mfu="auto", **kw).layer_s < auto.layer_s


def test_a_users_gpu_from_yaml_is_usable_and_bad_fields_are_named(monkeypatch):
    monkeypatch.setattr(gpu_specs, "COMPUTE_SPECS", dict(gpu_specs.COMPUTE_SPECS))
    monkeypatch.setitem(GPUS, "X1", GPUS["H100"])  # restored after the test
    gpu_specs.register_gpu("x1", {"peak_tflops": 500, "memory_gb": 96, "hbm_gbps": 4000, "nvlink_gbps": 900,
                                  "like": "H100", "gemm_eff": 0.5})
    assert GPUS["X1"].peak_tflops == 500 and gpu_specs.compute_spec("X1").gemm_eff == 0.5
    assert gemm_s(4096, 4096, 4096, "X1") > gemm_s(4096, 4096, 4096, "H100")
    with pytest.raises(SpecError, match="costs.gpus.X2: missing"):
        gpu_specs.register_gpu("x2", {"peak_tflops": 1})
    with pytest.raises(SpecError, match="unknown keys"):
        gpu_specs.register_gpu("x1", {"gemm_speed": 1})


def _row(pp: int, v: int) -> Row:
    return Row("t", MODELS["llama3-70b"], "H100", 8 * pp * 4, 8, pp, 4, 64, 1, "none", v, True, False, 1.0,
               "tokens_per_s_per_gpu")


def test_published_iteration_pays_the_bubble_of_its_schedule():
    assert iteration_s(_row(8, 1)) > iteration_s(_row(8, 2)) > iteration_s(_row(8, 4))


def test_a_published_iteration_with_full_recompute_costs_one_more_forward_per_layer_and_microbatch():
    from dataclasses import replace

    for pp, v in ((1, 1), (8, 1), (8, 4)):
        none = _row(pp, v)
        full = replace(none, recompute="full")
        lt = layer_times(none.model, none.gpu, tp=none.tp, microbatch=none.microbatch, recompute="none",
                         sequence_parallel=True, overhead=1.0)
        m = none.global_batch / (none.dp * none.microbatch)
        slots = m + (pp - 1) / v  # microbatches on the last stage plus the bubble's stage times
        extra = slots * none.model.layers / pp * lt.fwd_s
        assert iteration_s(full, 1.0) - iteration_s(none, 1.0) == pytest.approx(extra, rel=1e-9)


def test_prefill_from_operators_grows_with_the_pass_and_writes_the_kv_cache():
    from dataclasses import replace

    from testbed.costs.prefill_ops import OpsCalibration, fit_ops, ops_time_s, pass_ops

    m = MODELS["llama2-70b"]
    works = [pass_ops(m, "H100", 4, t, b) for t, b in ((128, 1), (512, 1), (512, 4), (2048, 1), (8192, 1))]
    assert [w.ops_s for w in works] == sorted(w.ops_s for w in works)
    more_kv = replace(m, kv_heads=64)
    assert pass_ops(more_kv, "H100", 4, 2048).ops_s > pass_ops(m, "H100", 4, 2048).ops_s
    # a training forward at the same shape is the same operators minus the KV write and plus all logits
    truth = OpsCalibration(2e-4, 1.3, 1.1, 1.8)
    samples = [(w, ops_time_s(w, truth)) for w in works + [pass_ops(m, "H100", 8, t) for t in (256, 4096, 16384)]]
    got = fit_ops(samples)
    assert max(abs(ops_time_s(w, got) / t - 1) for w, t in samples) < 0.02


def test_a_spec_describes_its_own_gpu_and_its_dcs_run_on_it(tmp_path, zoo):
    from testbed.sim.choose import build_plan
    from testbed.spec.load import load_experiment
    from tests.conftest import ROOT

    spec = tmp_path / "exp.yaml"
    spec.write_text(f"""name: own-gpu
costs:
  gpus:
    L40S: {{peak_tflops: 362, memory_gb: 48, hbm_gbps: 864, nvlink_gbps: 64, like: A100, sms: 142}}
topology: {ROOT / "topologies" / "3dc.yaml"}
workload: {{model: tiny, global_batch: 32, tp: 1, pp: 3, dp: 2, mfu: auto}}
schedulers: [atlas]
""")
    (exp, _), = load_experiment(spec, ["topology.dcs.*.gpu=l40s"])
    plan = build_plan(exp, "atlas")
    assert set(plan.gpu_types.values()) == {"L40S"}
    (a100, _), = load_experiment(spec, ["topology.dcs.*.gpu=a100"])
    assert sum(build_plan(a100, "atlas").fwd_s[0]) < sum(plan.fwd_s[0])  # A100's HBM is faster than the L40S's
    with pytest.raises(SpecError, match="costs.gpus.L40S.hbm_gbps: out of range"):
        load_experiment(spec, ["costs.gpus.L40S.hbm_gbps=0"])


@pytest.mark.parametrize("gpu", ["A100", "H100"])
def test_attention_without_flash_pays_for_the_scores_it_materialises(gpu):
    from testbed.costs.operators import unfused_attention_s

    g = GPUS[gpu]
    for b, s, h, d in [(1, 512, 8, 64), (2, 2048, 28, 128), (1, 8192, 8, 128)]:
        floor = 4 * b * h * s * s * d / (g.peak_tflops * 1e12) + 2 * 2 * b * h * s * s / g.hbm_bytes_per_s
        assert unfused_attention_s(b, s, h, d, gpu, dropout=False) >= floor
        assert unfused_attention_s(b, s, h, d, gpu) > unfused_attention_s(b, s, h, d, gpu, dropout=False)
    # its share grows with the sequence: at 8K tokens it costs more than FlashAttention's causal kernel
    assert unfused_attention_s(1, 8192, 8, 128, gpu) > attention_s(1, 8192, 8, 128, gpu)


@pytest.mark.parametrize("gpu", ["A100", "H100", "B200"])
def test_flashattention_in_triton_is_slower_than_fa2_by_its_stated_ratios(gpu):
    from testbed.costs.operators import FA2_OVER_TRITON

    for s, d, backward in itertools.product((512, 2048, 8192), (64, 128), (False, True)):
        best, fa2, triton = (attention_s(2, s, 16, d, gpu, backward=backward, kernel=k)
                             for k in ("best", "fa2", "triton"))
        assert best <= fa2 < triton
        spec = gpu_specs.compute_spec(gpu)
        ratio = attention_eff(s, d, spec, backward, "fa2") / attention_eff(s, d, spec, backward, "triton")
        assert ratio == pytest.approx(FA2_OVER_TRITON[1 if backward else 0])
    with pytest.raises(ValueError, match="attention kernel"):
        attention_eff(1024, 128, gpu_specs.compute_spec(gpu), False, "fa4")


def test_dropout_costs_memory_time_only_where_the_model_runs_it():
    gpt = MODELS["gpt3-175b"]  # GPT-style: dropout by default
    kw = {"tp": 1, "microbatch": 1, "recompute": "none"}
    default, off, on = (layer_times(gpt, "H100", dropout=x, **kw) for x in (None, False, True))
    assert default.parts["memory"] == on.parts["memory"] > off.parts["memory"]
    assert default.parts["gemm"] == off.parts["gemm"] and default.parts["attention"] == off.parts["attention"]
    llama = MODELS["llama3-70b"]  # gated: no dropout unless asked
    gated = layer_times(llama, "H100", **kw).parts["memory"]
    assert gated == layer_times(llama, "H100", dropout=False, **kw).parts["memory"]


def test_fsdp_microbatch_exposes_the_backward_gathers_and_is_bound_by_its_collectives():
    from testbed.costs.collectives import ring_latency_s
    from testbed.costs.published import fsdp_microbatch_s

    params, bw = 13e9, 360e9
    gather = params * 2 * 7 / 8 / bw
    for compute in (0.01, 0.2, 1.0, 5.0):
        t = fsdp_microbatch_s(compute, params, 8, bw)
        assert t >= compute + gather  # BACKWARD_POST: the backward waits for every gather
        assert t >= 3 * gather  # two gathers and a reduce-scatter per microbatch
        assert fsdp_microbatch_s(compute, 2 * params, 8, bw) > t  # more weights, more to gather
        assert fsdp_microbatch_s(compute, params, 8, 2 * bw) < t  # a faster network exposes less
    assert fsdp_microbatch_s(1.0, params, 1, bw) == 1.0  # one GPU gathers nothing
    lat = ring_latency_s(8, 8)
    for compute in (0.01, 1.0):  # BACKWARD_PRE hides the backward's gathers; SHARD_GRAD_OP gathers once
        assert fsdp_microbatch_s(compute, params, 8, bw, "pre") == pytest.approx(max(compute, 3 * gather) + 3 * lat)
        assert fsdp_microbatch_s(compute, params, 8, bw, "kept") == pytest.approx(max(compute, 2 * gather) + 2 * lat)
        assert fsdp_microbatch_s(compute, params, 8, bw, "kept") <= fsdp_microbatch_s(compute, params, 8, bw, "pre") \
            <= fsdp_microbatch_s(compute, params, 8, bw, "post")
    with pytest.raises(ValueError, match="fsdp backward"):
        fsdp_microbatch_s(1.0, params, 8, bw, "early")


def test_ring_latency_grows_with_the_ranks_and_a_network_hop_costs_more_than_an_nvlink_hop():
    from testbed.costs.collectives import ring_latency_s

    assert ring_latency_s(1, 8) == 0.0
    lat = [ring_latency_s(n, 8) for n in (2, 8, 16, 64, 128, 512, 4096)]
    assert lat == sorted(lat) and len(set(lat)) == len(lat)
    assert ring_latency_s(16, 1) > ring_latency_s(16, 8) > ring_latency_s(16, 16)  # more nodes, more net hops
    with pytest.raises(ValueError, match="ranks_per_node"):
        ring_latency_s(8, 0)


def test_fsdp_pays_each_collectives_ring_latency_so_more_ranks_at_fixed_work_are_never_faster():
    from testbed.costs.collectives import ring_latency_s
    from testbed.costs.published import fsdp_microbatch_s

    params, bw, units = 1.3e9, 360e9, 25
    for backward, per_unit in (("post", 3), ("pre", 3), ("kept", 2)):
        for compute in (0.05, 0.5, 5.0):
            times = [fsdp_microbatch_s(compute, params, dp, bw, backward, units) for dp in (8, 64, 128, 256, 512)]
            assert times == sorted(times), (backward, compute)
            # compute-bound or not, the latency is never hidden
            assert times[-1] - times[0] >= per_unit * units * (ring_latency_s(512, 8) - ring_latency_s(8, 8)) * 0.999
        more_units = fsdp_microbatch_s(0.5, params, 512, bw, backward, 2 * units)
        assert more_units > fsdp_microbatch_s(0.5, params, 512, bw, backward, units)  # a collective per unit


def test_a_published_row_with_an_unknown_attention_kernel_is_refused(tmp_path):
    import csv

    from testbed.costs.published import load_rows
    from tests.conftest import ROOT

    with open(ROOT / "bench" / "data" / "published_training.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    rows[-1]["attention"] = "fa9"
    with open(tmp_path / "x.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows[-2:])
    with pytest.raises(SpecError, match="x.csv:3"):
        load_rows(tmp_path / "x.csv")


@pytest.mark.parametrize("model_name", ["tiny", "llama3-70b"])
def test_zero_bubbles_w_is_the_weight_gradient_gemms_and_b_the_rest(model_name):
    """W (deferred into the bubbles) is the (k x m) @ (m x n) weight-gradient GEMMs at their shapes; B, the
    rest of the backward, holds the input-gradient GEMMs of the same FLOPs plus attention and memory-bound
    kernels, so it is never shorter than W, launch-bound or not."""
    from testbed.costs.operators import COMPUTE_OVERHEAD, gemm_s, layer_gemms, layer_times

    model = MODELS[model_name]
    t = layer_times(model, "H100", tp=2, microbatch=1, recompute="none")
    want = COMPUTE_OVERHEAD * sum(gemm_s(k, n, m, "H100") for m, n, k in layer_gemms(model, model.seq_len, 2))
    assert t.wgrad_s == pytest.approx(want)
    assert 0 < t.wgrad_s <= t.bwd_s - t.wgrad_s
    assert 0 < t.head_wgrad_s < t.head_bwd_s

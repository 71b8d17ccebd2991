import math

import pytest

from testbed.costs.gpus import GPUS
from testbed.costs.models import MODELS
from testbed.costs.stage import layer_costs, optimizer_step_s, split_layers, stage_costs, tp_allreduce_s
from testbed.costs.tcp import connections_for, per_connection_bytes_s, striped_rate


def test_param_counts_match_published_sizes():
    for name, billions in [("gpt3-175b", 175), ("llama3-8b", 8.0), ("llama3-70b", 70.6), ("llama3-405b", 405),
                           ("llama2-7b", 6.7), ("llama2-13b", 13.0), ("llama2-70b", 69.0)]:
        assert MODELS[name].total_params() / 1e9 == pytest.approx(billions, rel=0.04), name


def test_megatron_flops_formula():
    m = MODELS["gpt3-175b"]
    b, s, h = 1, m.seq_len, m.hidden
    # Narayanan et al. 2021: 24 b s h^2 + 4 b s^2 h per layer forward (they drop the norms)
    assert m.layer_fwd_flops(b * s, s) == pytest.approx(24 * b * s * h * h + 4 * b * s * s * h, rel=1e-6)


def test_split_layers():
    assert split_layers(96, 12) == [8] * 12
    assert sum(split_layers(126, 16)) == 126
    assert split_layers(10, 4) == [2, 3, 3, 2]


def test_stage_costs_shape():
    cs = stage_costs(MODELS["gpt3-175b"], "H100", pp=12, tp=8, dp=36, microbatch=1, microbatches=48, mfu=0.5,
                     recompute="selective", schedule="1f1b", distributed_optimizer=True)
    assert len(cs) == 12
    assert cs[0].act_bytes == 2048 * 12288 * 2
    assert cs[-1].fwd_s > cs[5].fwd_s  # the output head
    assert cs[0].mem_gb > cs[-2].mem_gb  # stage 0 holds the most in-flight activations under 1F1B
    assert all(c.mem_gb < 80 for c in cs)
    assert all(c.optimizer_s > 0 and c.tp_comm_s > 0 for c in cs)


def test_tensor_parallel_allreduces_per_layer():
    """Megatron: two all-reduces of b*s*h*2 bytes per layer forward, two backward (four with full
    recomputation), each a ring over the TP group's NVLink: 2(t-1)/t of the bytes at half the datasheet's
    both-ways figure."""
    m, h100 = MODELS["gpt3-175b"], GPUS["H100"]
    ar = 2 * 7 / 8 * 2048 * 12288 * 2 / (900e9 / 2)
    assert tp_allreduce_s(2048 * 12288 * 2, 8, h100) == pytest.approx(ar)
    assert tp_allreduce_s(1e9, 1, h100) == 0.0
    kw = {"tp": 8, "dp": 4, "microbatch": 1, "mfu": 0.5, "distributed_optimizer": True}
    sel = layer_costs(m, "H100", recompute="selective", **kw)
    full = layer_costs(m, "H100", recompute="full", **kw)
    compute = m.layer_fwd_flops(2048, 2048) / (989e12 * 0.5 * 8)
    assert sel.fwd_s == pytest.approx(compute + 2 * ar)
    assert sel.bwd_s == pytest.approx(2 * compute + 2 * ar)
    assert full.bwd_s == pytest.approx(3 * compute + 4 * ar)
    assert sel.tp_comm_s == pytest.approx(4 * ar) and full.tp_comm_s == pytest.approx(6 * ar)
    assert layer_costs(m, "A100", recompute="selective", **kw).tp_comm_s == pytest.approx(4 * ar * 900 / 600)


def test_optimizer_step_reads_and_writes_the_shard_once():
    m = MODELS["llama3-8b"]
    for dist, shard in ((True, 4 * 2), (False, 4)):
        c = stage_costs(m, "H200", pp=4, tp=4, dp=2, microbatch=1, microbatches=8, mfu=0.5, recompute="selective",
                        schedule="1f1b", distributed_optimizer=dist)[1]
        assert c.optimizer_s == pytest.approx(30 * c.params / shard / 4.8e12)
        assert c.optimizer_s == pytest.approx(optimizer_step_s(c.params / shard, GPUS["H200"]))


def test_sequence_parallel_shrinks_activations_by_tp():
    """Korthikanti et al.: per layer s*b*h*(10 + 24/t) without and 34*s*b*h/t with sequence parallelism."""
    m = MODELS["llama3-70b"]
    s, h = m.seq_len, m.hidden
    kw = {"dp": 8, "microbatch": 1, "mfu": 0.5, "recompute": "selective", "distributed_optimizer": True}
    off = layer_costs(m, "H100", tp=8, sequence_parallel=False, **kw)
    on = layer_costs(m, "H100", tp=8, sequence_parallel=True, **kw)
    assert off.act_bytes == pytest.approx(s * h * (10 + 24 / 8))
    assert on.act_bytes == pytest.approx(34 * s * h / 8)
    assert (on.fwd_s, on.bwd_s) == (off.fwd_s, off.bwd_s)  # same bytes over NVLink, same compute
    one = {sp: layer_costs(m, "H100", tp=1, sequence_parallel=sp, **kw).act_bytes for sp in (False, True)}
    assert one[True] == pytest.approx(one[False])  # nothing to split without tensor parallelism
    peak = {sp: max(c.mem_gb for c in stage_costs(m, "H100", pp=8, tp=8, dp=16, microbatch=1, microbatches=16,
                                                  mfu=0.5, recompute="selective", schedule="1f1b",
                                                  distributed_optimizer=True, sequence_parallel=sp))
            for sp in (False, True)}
    assert peak[True] < peak[False]


def test_gpu_zoo_has_datasheet_bandwidths():
    for g in GPUS.values():
        assert g.hbm_gbps > 1000 and g.nvlink_gbps >= 600
        assert g.nvlink_bytes_per_s == g.nvlink_gbps / 2 * 1e9


def test_tcp_window_model():
    W, rtt, C = 6 * 2**20, 0.07, 50e9
    assert per_connection_bytes_s(W, rtt) == pytest.approx(W / rtt)
    n = connections_for(C, W, rtt, 10_000)
    assert n == math.ceil(C * rtt / W)
    assert striped_rate(C, n, W, rtt) == C
    assert striped_rate(C, 1, W, rtt) == pytest.approx(W / rtt)
    assert connections_for(C, W, rtt, 16) == 16
    assert connections_for(C, W, 0.0, 16) == 1

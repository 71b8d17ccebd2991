import math

import pytest

from testbed.costs.models import MODELS
from testbed.costs.stage import split_layers, stage_costs
from testbed.costs.tcp import connections_for, per_connection_bps, striped_rate


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
    assert all(c.bwd_s == pytest.approx(2 * c.fwd_s) for c in cs)
    assert cs[0].mem_gb > cs[-2].mem_gb  # stage 0 holds the most in-flight activations under 1F1B
    assert all(c.mem_gb < 80 for c in cs)


def test_tcp_window_model():
    W, rtt, C = 6 * 2**20, 0.07, 50e9
    assert per_connection_bps(W, rtt) == pytest.approx(W / rtt)
    n = connections_for(C, W, rtt, 10_000)
    assert n == math.ceil(C * rtt / W)
    assert striped_rate(C, n, W, rtt) == C
    assert striped_rate(C, 1, W, rtt) == pytest.approx(W / rtt)
    assert connections_for(C, W, rtt, 16) == 16
    assert connections_for(C, W, 0.0, 16) == 1

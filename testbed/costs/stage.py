"""Per-stage compute time, transfer bytes and memory of a pipeline-parallel transformer."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.costs.gpus import GPUS, tp_efficiency
from testbed.costs.models import ModelConfig

BF16 = 2
WORKSPACE_GB = 2.0  # CUDA context, NCCL buffers, allocator fragmentation


def split_layers(layers: int, pp: int) -> list[int]:
    """Layers per stage as even as possible; the remainder goes to middle stages (the ends hold
    the embedding and the output head)."""
    base, extra = divmod(layers, pp)
    counts = [base] * pp
    order = list(range(1, pp - 1)) + [0, pp - 1] if pp > 2 else list(range(pp))
    for i in order[:extra]:
        counts[i] += 1
    return counts


@dataclass(frozen=True)
class StageCost:
    layers: int
    params: int
    fwd_s: float  # one microbatch, forward
    bwd_s: float  # one microbatch, backward (incl. recomputation)
    act_bytes: float  # activation to the next stage per microbatch (whole TP group)
    grad_bytes: float  # gradient of this stage's parameters (bf16), reduced across DP
    mem_gb: float  # peak per GPU
    act_gb_per_microbatch: float  # what one more in-flight microbatch adds per GPU


def stage_costs(
    model: ModelConfig,
    gpu_name: str,
    *,
    pp: int,
    tp: int,
    dp: int,
    microbatch: int,
    microbatches: int,
    mfu: float,
    recompute: str,
    schedule: str,
    distributed_optimizer: bool,
) -> list[StageCost]:
    gpu = GPUS[gpu_name]
    s, b, h = model.seq_len, microbatch, model.hidden
    tokens = s * b
    rate = gpu.peak_tflops * 1e12 * mfu * tp_efficiency(tp) * tp  # FLOP/s of one TP group
    bwd_factor = {"none": 2.0, "selective": 2.0, "full": 3.0}[recompute]
    bytes_per_param = 2 + 4 + (12 / dp if distributed_optimizer else 12)
    out = []
    for i, n in enumerate(split_layers(model.layers, pp)):
        flops = n * model.layer_fwd_flops(tokens, s)
        params = n * model.layer_params()
        if i == 0:
            params += model.embedding_params()
        if i == pp - 1:
            flops += model.logits_fwd_flops(tokens)
            params += model.embedding_params()
        fwd = flops / rate
        # Korthikanti et al. 2022: activation bytes per layer with TP (no sequence parallelism)
        if recompute == "full":
            act_layer = 2 * s * b * h
        else:
            act_layer = s * b * h * (10 + 24 / tp)
            if recompute == "none":
                act_layer += 5 * model.heads * s * s * b / tp
        in_flight = min(pp - i, microbatches) if schedule == "1f1b" else microbatches
        act_mem = n * act_layer * in_flight
        if i == pp - 1:
            act_mem += 4 * s * b * model.vocab / tp  # fp32 logits of one microbatch
        mem = params / tp * bytes_per_param + act_mem
        out.append(
            StageCost(
                layers=n,
                params=params,
                fwd_s=fwd,
                bwd_s=bwd_factor * fwd,
                act_bytes=float(tokens * h * BF16),
                grad_bytes=float(params * BF16),
                mem_gb=mem / 1e9 + WORKSPACE_GB,
                act_gb_per_microbatch=n * act_layer / 1e9,
            )
        )
    return out

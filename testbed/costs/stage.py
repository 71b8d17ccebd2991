"""Per-stage compute time, transfer bytes, memory and optimizer step of a pipeline-parallel transformer.

Every formula is stated in docs/planner.md. Stages may hold different numbers of layers and run on
different GPU types: a stage's cost is the sum of its layers' costs on its GPU (plus the embedding
on the first stage and the output head on the last).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from testbed.costs.gpus import GPU, GPUS
from testbed.costs.models import ModelConfig
from testbed.costs.operators import layer_times

BF16 = 2
WORKSPACE_GB = 2.0  # CUDA context, NCCL buffers, allocator fragmentation
# AdamW in mixed precision, per parameter of the GPU's shard: read the fp32 gradient, master weight,
# first and second moments (16 bytes); write master weight and moments (12) and the bf16 weight (2).
ADAMW_BYTES_PER_PARAM = 30


def split_layers(layers: int, pp: int) -> list[int]:
    """Layers per stage as even as possible; the remainder goes to middle stages (the ends hold
    the embedding and the output head)."""
    base, extra = divmod(layers, pp)
    counts = [base] * pp
    order = list(range(1, pp - 1)) + [0, pp - 1] if pp > 2 else list(range(pp))
    for i in order[:extra]:
        counts[i] += 1
    return counts


def tp_allreduce_s(nbytes: float, tp: int, gpu: GPU) -> float:
    """Ring all-reduce of `nbytes` inside a TP group over NVLink: each GPU sends 2(tp-1)/tp of it."""
    if tp <= 1:
        return 0.0
    return 2 * (tp - 1) / tp * nbytes / gpu.nvlink_bytes_per_s


def optimizer_step_s(params_per_gpu: float, gpu: GPU) -> float:
    """AdamW over the GPU's parameter shard: memory-bound, bytes read and written / HBM bandwidth."""
    return ADAMW_BYTES_PER_PARAM * params_per_gpu / gpu.hbm_bytes_per_s


@dataclass(frozen=True)
class StageCost:
    layers: int
    params: int
    fwd_s: float  # one microbatch, forward (incl. tensor-parallel all-reduces)
    bwd_s: float  # one microbatch, backward (incl. recomputation and tensor-parallel all-reduces)
    act_bytes: float  # activation to the next stage per microbatch (whole TP group)
    grad_bytes: float  # gradient of this stage's parameters (bf16), reduced across DP
    mem_gb: float  # peak per GPU
    act_gb_per_microbatch: float  # what one more in-flight microbatch adds per GPU
    optimizer_s: float = 0.0  # AdamW step over the GPU's shard, after the gradient all-reduce
    tp_comm_s: float = 0.0  # tensor-parallel all-reduces per microbatch, forward and backward together


@dataclass(frozen=True)
class LayerCosts:
    """What one layer (and the model's ends) costs on one GPU type for one job shape, per GPU of a
    TP group and per microbatch. Stage costs are sums of these; the planner balances layers with them."""

    model: ModelConfig
    gpu: GPU
    tp: int
    dp: int
    microbatch: int
    distributed_optimizer: bool
    fwd_s: float  # one layer, forward
    bwd_s: float  # one layer, backward
    tp_comm_s: float  # one layer, forward and backward all-reduces
    head_fwd_s: float  # the output head (last stage)
    head_bwd_s: float
    act_bytes: float  # activation memory of one layer per in-flight microbatch
    weight_bytes: float  # weights, gradients and optimizer state of one layer
    embed_weight_bytes: float  # the same for the embedding (first stage) or the output head (last)
    logits_bytes: float  # fp32 logits of one microbatch (last stage)
    wgrad_s: float = 0.0  # one layer's weight-gradient GEMMs (zero-bubble's W), inside bwd_s
    head_wgrad_s: float = 0.0  # the output head's, inside head_bwd_s

    @property
    def layer_s(self) -> float:
        return self.fwd_s + self.bwd_s

    def stage_s(self, layers: int, last: bool) -> float:
        """Forward plus backward of one microbatch through a stage of `layers` layers."""
        return layers * self.layer_s + (self.head_fwd_s + self.head_bwd_s if last else 0.0)

    def fixed_bytes(self, first: bool, last: bool) -> float:
        return (WORKSPACE_GB * 1e9 + (self.embed_weight_bytes if first else 0.0)
                + (self.embed_weight_bytes + self.logits_bytes if last else 0.0))

    def layer_bytes(self, in_flight: int) -> float:
        return self.weight_bytes + self.act_bytes * in_flight

    def mem_gb(self, layers: int, first: bool, last: bool, in_flight: int) -> float:
        return (self.fixed_bytes(first, last) + layers * self.layer_bytes(in_flight)) / 1e9

    def max_layers(self, first: bool, last: bool, in_flight: int) -> int:
        """Most layers a stage at this position holds within the GPU's memory (0 if none)."""
        room = self.gpu.memory_gb * 1e9 - self.fixed_bytes(first, last)
        per = self.layer_bytes(in_flight)
        return max(0, int(room // per)) if room > 0 else 0

    def stage(self, layers: int, first: bool, last: bool, in_flight: int) -> StageCost:
        m = self.model
        params = layers * m.layer_params() + (m.embedding_params() if first else 0) + (
            m.embedding_params() if last else 0)
        shard = params / self.tp / (self.dp if self.distributed_optimizer else 1)
        return StageCost(
            layers=layers,
            params=params,
            fwd_s=layers * self.fwd_s + (self.head_fwd_s if last else 0.0),
            bwd_s=layers * self.bwd_s + (self.head_bwd_s if last else 0.0),
            act_bytes=float(m.seq_len * self.microbatch * m.hidden * BF16),
            grad_bytes=float(params * BF16),
            mem_gb=self.mem_gb(layers, first, last, in_flight),
            act_gb_per_microbatch=layers * self.act_bytes / 1e9,
            optimizer_s=optimizer_step_s(shard, self.gpu),
            tp_comm_s=layers * self.tp_comm_s,
        )


def layer_costs(
    model: ModelConfig,
    gpu_name: str,
    *,
    tp: int,
    dp: int,
    microbatch: int,
    mfu: float | str,
    recompute: str,
    distributed_optimizer: bool,
    sequence_parallel: bool = False,
) -> LayerCosts:
    """`mfu`: a typed fraction of peak (every layer's FLOPs at it), or `auto`: each operator at its
    shape on the GPU (`costs/operators.py`), MFU then an output."""
    gpu = GPUS[gpu_name]
    s, b, h, a = model.seq_len, microbatch, model.hidden, model.heads
    tokens = s * b
    if mfu == "auto":
        op = layer_times(model, gpu_name, tp=tp, microbatch=microbatch, recompute=recompute,
                         sequence_parallel=sequence_parallel)
        fwd, bwd, tp_comm, head_fwd, head_bwd = op.fwd_s, op.bwd_s, op.tp_comm_s, op.head_fwd_s, op.head_bwd_s
        wgrad, head_wgrad = op.wgrad_s, op.head_wgrad_s
    else:
        rate = gpu.peak_tflops * 1e12 * float(mfu) * tp  # FLOP/s of one TP group
        compute = model.layer_fwd_flops(tokens, s) / rate
        # Megatron tensor parallelism: two all-reduces of the layer's b*s*h activation per forward (after
        # attention and after the MLP), two per backward; full recomputation repeats the forward's two.
        # Sequence parallelism turns each into a reduce-scatter plus an all-gather: the same bytes.
        ar = tp_allreduce_s(tokens * h * BF16, tp, gpu)
        fwd = compute + 2 * ar
        bwd = 2 * compute + 2 * ar + (fwd if recompute == "full" else 0.0)
        tp_comm = (4 + (2 if recompute == "full" else 0)) * ar
        head_fwd = model.logits_fwd_flops(tokens) / rate
        head_bwd = 2 * head_fwd
        wgrad, head_wgrad = compute, head_fwd  # the weight gradients: one GEMM pass as long as the forward's
    # Korthikanti et al. 2022, activation bytes per layer per microbatch (per GPU of the TP group)
    if recompute == "full":
        act = 2 * s * b * h / (tp if sequence_parallel else 1)
    else:
        act = s * b * h * 34 / tp if sequence_parallel else s * b * h * (10 + 24 / tp)
        if recompute == "none":
            act += 5 * a * s * s * b / tp
    bytes_per_param = 2 + 4 + (12 / dp if distributed_optimizer else 12)
    return LayerCosts(
        model=model, gpu=gpu, tp=tp, dp=dp, microbatch=microbatch, distributed_optimizer=distributed_optimizer,
        fwd_s=fwd, bwd_s=bwd, tp_comm_s=tp_comm, head_fwd_s=head_fwd, head_bwd_s=head_bwd,
        act_bytes=act, weight_bytes=model.layer_params() / tp * bytes_per_param,
        embed_weight_bytes=model.embedding_params() / tp * bytes_per_param,
        logits_bytes=4 * s * b * model.vocab / tp, wgrad_s=wgrad, head_wgrad_s=head_wgrad,
    )


def interleaved_warmup(stage: int, pp: int, m: int, v: int) -> int:
    """Forwards before the steady one-forward-one-backward phase of Megatron-LM's interleaved 1F1B, counted in
    (microbatch, chunk) steps: 2 (pp - stage - 1) + (v - 1) pp, all m v of them when that is more
    (NVIDIA/Megatron-LM, megatron/core/pipeline_parallel/schedules.py, get_pp_rank_microbatches as
    forward_backward_pipelining_with_interleaving calls it, microbatch_group_size_per_vp_stage = pp)."""
    return min(2 * (pp - stage - 1) + (v - 1) * pp, m * v)


def in_flight(stage: int, pp: int, microbatches: int, schedule: str, virtual_stages: int = 1) -> float:
    """Microbatches whose activations a stage holds at its peak, in whole-stage microbatches: 1F1B keeps
    pp - stage, GPipe all, zero-bubble pp on every stage. Interleaved 1F1B holds its warm-up forwards plus one,
    each on one of the stage's v chunks (a v-th of its layers on average): (warm-up + 1) / v."""
    if virtual_stages > 1:
        total = microbatches * virtual_stages
        return min(interleaved_warmup(stage, pp, microbatches, virtual_stages) + 1, total) / virtual_stages
    if schedule == "zb":  # any stage may hold pp microbatches (1F1B's peak, on its first stage)
        return min(pp, microbatches)
    return min(pp - stage, microbatches) if schedule == "1f1b" else microbatches


def stage_costs(
    model: ModelConfig,
    gpus: str | Sequence[str],
    *,
    pp: int,
    tp: int,
    dp: int,
    microbatch: int,
    microbatches: int,
    mfu: float | str,
    recompute: str,
    schedule: str,
    distributed_optimizer: bool,
    sequence_parallel: bool = False,
    layers: Sequence[int] | None = None,
) -> list[StageCost]:
    """Costs of each stage; `gpus` is one GPU type for all stages or one per stage, `layers` the
    layers per stage (default: as even as possible)."""
    names = [gpus] * pp if isinstance(gpus, str) else list(gpus)
    counts = list(layers) if layers is not None else split_layers(model.layers, pp)
    per_gpu = {g: layer_costs(model, g, tp=tp, dp=dp, microbatch=microbatch, mfu=mfu, recompute=recompute,
                              distributed_optimizer=distributed_optimizer, sequence_parallel=sequence_parallel)
               for g in set(names)}
    return [per_gpu[g].stage(n, i == 0, i == pp - 1, in_flight(i, pp, microbatches, schedule))
            for i, (g, n) in enumerate(zip(names, counts, strict=True))]

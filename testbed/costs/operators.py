"""Per-operator compute time of a transformer layer on one GPU of a tensor-parallel group.

Each operator gets a time from its real shape on the GPU (`costs/gpu_specs.py`):

- GEMM (m x k) @ (k x n) in bf16: the library's output tiles are spread over the SMs in waves; a wave
  costs one tile's work on every SM at `gemm_eff` of peak, stretched by the tile's fixed cost
  (k / (k + k_half)); a small GEMM is bound by its bytes at HBM speed instead (the roofline). The
  best of a few tile shapes is taken, as cuBLAS's heuristics do.
- Attention: FlashAttention (2 on Ampere, 3 / cuDNN on Hopper and later) at a fraction of peak that
  grows with the sequence length (s / (s + attn_seq_half)) and with the head dimension; causal.
- Memory-bound operators (norms, activations, residuals, rotary, dropout, cross-entropy): their bytes
  at `hbm_eff` of the HBM bandwidth, one kernel launch each.
- Tensor-parallel collectives over NVLink: ring all-reduce (or, with sequence parallelism, a
  reduce-scatter plus an all-gather: the same bytes) at `nvlink_eff` of one direction's bandwidth.

Formulas and the shapes of every GEMM are stated in docs/compute.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.costs.gpu_specs import ComputeSpec, compute_spec
from testbed.costs.gpus import GPU, GPUS
from testbed.costs.models import ModelConfig

BF16 = 2
# what a training framework adds over the operators listed here (data loading, synchronisation, small
# kernels): the one constant fitted on measurements, on one source only, Llama 3's H100 runs, by
# `bench/compute_model_error.py` (held out: every other source in bench/data/published_training.csv)
COMPUTE_OVERHEAD = 1.246


def gemm_roofline_s(m: int, n: int, k: int, gpu: GPU) -> float:
    """The fastest a GEMM can run: its FLOPs at peak or its bytes at HBM bandwidth, whichever binds."""
    return max(2.0 * m * n * k / (gpu.peak_tflops * 1e12), BF16 * (m * k + k * n + m * n) / gpu.hbm_bytes_per_s)


def _tiles_s(m: int, n: int, k: int, tm: int, tn: int, gpu: GPU, spec: ComputeSpec) -> float:
    waves = math.ceil(math.ceil(m / tm) * math.ceil(n / tn) / spec.sms)
    slot_flops = 2.0 * tm * tn * k * spec.sms  # one wave: a tile on every SM
    return waves * slot_flops / (gpu.peak_tflops * 1e12 * spec.gemm_eff) * (k + spec.k_half) / k


def gemm_s(m: int, n: int, k: int, gpu_name: str) -> float:
    """Time of one bf16 GEMM (m x k) @ (k x n) on `gpu_name`; 0 for an empty one."""
    if min(m, n, k) <= 0:
        return 0.0
    gpu, spec = GPUS[gpu_name], compute_spec(gpu_name)
    tiles = {(spec.tile_m, spec.tile_n), (spec.tile_n, spec.tile_m), (min(spec.tile_m, spec.tile_n),) * 2}
    compute = min(_tiles_s(m, n, k, tm, tn, gpu, spec) for tm, tn in tiles)
    memory = BF16 * (m * k + k * n + m * n) / (gpu.hbm_bytes_per_s * spec.hbm_eff)
    return max(compute, memory) + spec.launch_s


def attention_flops(batch: int, seq: int, heads: int, head_dim: int, cached: int = 0) -> float:
    """Forward FLOPs of causal attention (scores and weighted sum) for `seq` new tokens after `cached`."""
    return 4.0 * batch * seq * (cached + seq / 2) * heads * head_dim


# FlashAttention-2 on Hopper (a stack without FlashAttention-3 or cuDNN's fused attention): the FA3 paper's
# FA2 baseline on H100, about 35 % of peak forward and 30 % backward at head dimension 128
FA2_ON_HOPPER = (0.35, 0.30)
# FlashAttention's Triton implementation (the FlashAttention-1 algorithm; llm-foundry's `attn_impl: triton`):
# FlashAttention-2 is "around 1.3-1.5x faster than FlashAttention in Triton in the forward pass and around 2x
# faster in the backward pass" (Dao, FlashAttention-2, arXiv:2307.08691, section 4.1): forward, backward
FA2_OVER_TRITON = (1.4, 2.0)
ATTENTION_KERNELS = ("best", "fa2", "triton", "unfused")


def attention_eff(seq: int, head_dim: int, spec: ComputeSpec, backward: bool, kernel: str = "best") -> float:
    """Fraction of peak FlashAttention reaches: rises with the sequence and the head dimension.
    `kernel`: `best` (the GPU's own: FA2 on Ampere, FA3 / cuDNN on Hopper and later), `fa2`, or `triton`
    (FlashAttention in Triton: FA2's rate over FA2_OVER_TRITON)."""
    if kernel not in ATTENTION_KERNELS[:3]:
        raise ValueError(f"attention kernel {kernel!r}: use one of {', '.join(ATTENTION_KERNELS[:3])}")
    base = spec.attn_bwd_eff if backward else spec.attn_fwd_eff
    if kernel in ("fa2", "triton"):
        base = min(base, FA2_ON_HOPPER[1] if backward else FA2_ON_HOPPER[0]) if spec.tile_n > spec.tile_m else base
    if kernel == "triton":
        base /= FA2_OVER_TRITON[1] if backward else FA2_OVER_TRITON[0]
    head = (head_dim / (head_dim + 32)) / (128 / 160)
    return min(0.95, base * seq / (seq + spec.attn_seq_half) * head)


def attention_s(batch: int, seq: int, heads: int, head_dim: int, gpu_name: str, backward: bool = False,
                cached: int = 0, kernel: str = "best") -> float:
    """FlashAttention forward (or backward: 2.5x the forward's FLOPs, as FlashAttention counts them)."""
    if seq <= 0 or heads <= 0:
        return 0.0
    gpu, spec = GPUS[gpu_name], compute_spec(gpu_name)
    flops = attention_flops(batch, seq, heads, head_dim, cached) * (2.5 if backward else 1.0)
    eff = attention_eff(seq + cached, head_dim, spec, backward, kernel)
    return flops / (gpu.peak_tflops * 1e12 * eff) + spec.launch_s


def unfused_attention_s(batch: int, seq: int, heads: int, head_dim: int, gpu_name: str, backward: bool = False,
                        dropout: bool = True) -> float:
    """Attention without FlashAttention (stacks before it): the scores (b heads s x s) are materialised.
    Forward: scores GEMM, fused scale-mask-softmax (read and write s^2 bf16), the probabilities' dropout
    (a 1-byte mask written, read and write), the weighted-sum GEMM; the whole s x s, no causal skipping.
    Backward: each GEMM's two gradient GEMMs, softmax and dropout backward."""
    if seq <= 0 or heads <= 0:
        return 0.0
    rows, elems = batch * heads * seq, batch * heads * seq * seq
    if backward:
        gemms = (gemm_s(rows, head_dim, seq, gpu_name) + gemm_s(rows, seq, head_dim, gpu_name)  # d scores
                 + gemm_s(rows, seq, head_dim, gpu_name) + gemm_s(rows, head_dim, seq, gpu_name))  # d probs, d values
        return gemms + memory_s(elems * (3 * BF16 + (5 if dropout else 0)), gpu_name, 2 if dropout else 1)
    gemms = gemm_s(rows, seq, head_dim, gpu_name) + gemm_s(rows, head_dim, seq, gpu_name)
    return gemms + memory_s(elems * (2 * BF16 + (5 if dropout else 0)), gpu_name, 2 if dropout else 1)


def memory_s(nbytes: float, gpu_name: str, kernels: int = 1) -> float:
    """Memory-bound kernels moving `nbytes` in all."""
    gpu, spec = GPUS[gpu_name], compute_spec(gpu_name)
    return nbytes / (gpu.hbm_bytes_per_s * spec.hbm_eff) + kernels * spec.launch_s


def allreduce_s(nbytes: float, tp: int, gpu_name: str) -> float:
    """Ring all-reduce of `nbytes` over a TP group's NVLink: 2(tp-1)/tp of it leaves each GPU, in
    2(tp-1) steps. A reduce-scatter plus an all-gather (sequence parallelism) costs the same."""
    if tp <= 1:
        return 0.0
    gpu, spec = GPUS[gpu_name], compute_spec(gpu_name)
    wire = 2 * (tp - 1) / tp * nbytes / (gpu.nvlink_bytes_per_s * spec.nvlink_eff)
    return wire + 2 * (tp - 1) * spec.collective_latency_s


@dataclass(frozen=True)
class LayerTimes:
    """One layer (and the output head) per microbatch on one GPU of the TP group."""

    fwd_s: float  # forward, including its tensor-parallel collectives
    bwd_s: float  # backward, including recomputation and collectives
    tp_comm_s: float  # the collectives, forward and backward together (recomputed ones included)
    head_fwd_s: float  # logits GEMM and cross-entropy (last stage)
    head_bwd_s: float
    parts: dict[str, float]  # forward time by operator kind: gemm, attention, memory, comm
    wgrad_s: float = 0.0  # the backward's weight-gradient GEMMs (zero-bubble's W)
    head_wgrad_s: float = 0.0  # the output head's weight-gradient GEMM


def layer_gemms(model: ModelConfig, tokens: int, tp: int) -> list[tuple[int, int, int]]:
    """(m, n, k) of the forward GEMMs of one layer on one GPU: QKV (grouped-query), attention
    output, MLP up (and gate), MLP down. Megatron splits QKV and up by columns, output and down by rows."""
    h, d = model.hidden, model.head_dim
    qkv = (model.heads + 2 * model.kv_heads) * d
    up = (2 if model.gated_mlp else 1) * model.ffn_hidden
    return [(tokens, qkv // tp, h), (tokens, h, model.heads * d // tp), (tokens, up // tp, h),
            (tokens, h, model.ffn_hidden // tp)]


def memory_bound_bytes(model: ModelConfig, tokens: int, tp: int, sequence_parallel: bool,
                       dropout: bool | None = None) -> tuple[float, int]:
    """Bytes the forward's memory-bound kernels move, and how many kernels: two norms (read, write),
    two residual adds (two reads, a write), dropout masks (`dropout`; by default models without a gated
    MLP, GPT-style, have them), rotary on Q and K (gated, Llama-style), the MLP's activation. Norms,
    residuals and dropouts run on 1/tp of the tokens under sequence parallelism, on all of them otherwise."""
    h, f = model.hidden, model.ffn_hidden
    rows = tokens / tp if sequence_parallel else tokens
    per_row = (4 + 6) * h * BF16  # 2 norms x (read + write), 2 residuals x (2 reads + write)
    kernels = 4
    if (not model.gated_mlp) if dropout is None else dropout:
        per_row += 2 * h  # two dropout masks (1 byte per element) written
        kernels += 2
    total = rows * per_row
    if model.gated_mlp:
        total += 2 * tokens * (model.heads + model.kv_heads) * model.head_dim / tp * BF16  # rotary
        total += 3 * tokens * f / tp * BF16  # SwiGLU: read gate and up, write
        kernels += 2
    else:
        total += 2 * tokens * f / tp * BF16  # GeLU: read, write
        kernels += 1
    return total, kernels


def layer_times(model: ModelConfig, gpu_name: str, *, tp: int, microbatch: int, recompute: str,
                sequence_parallel: bool = False, attention: str = "best", dropout: bool | None = None,
                overhead: float = COMPUTE_OVERHEAD) -> LayerTimes:
    """Forward and backward of one layer per microbatch at the model's sequence length, every time
    multiplied by `overhead`. `attention`: `best` (the GPU's FlashAttention), `fa2`, `triton`, or `unfused`
    (the scores materialised, as stacks before FlashAttention ran it). `dropout`: whether the model runs
    dropout (None: GPT-style models without a gated MLP do, Llama-style ones do not)."""
    s, b = model.seq_len, microbatch
    tokens = s * b
    gemm_f = sum(gemm_s(m, n, k, gpu_name) for m, n, k in layer_gemms(model, tokens, tp))
    # backward: the input gradient (m x n) @ (n x k) and the weight gradient (k x m) @ (m x n)
    gemm_w = sum(gemm_s(k, n, m, gpu_name) for m, n, k in layer_gemms(model, tokens, tp))
    gemm_b = sum(gemm_s(m, k, n, gpu_name) for m, n, k in layer_gemms(model, tokens, tp)) + gemm_w
    heads = model.heads // tp if model.heads >= tp else 1
    if attention == "unfused":
        drop = (not model.gated_mlp) if dropout is None else dropout  # GPT-style: Megatron's attention dropout
        attn_f = unfused_attention_s(b, s, heads, model.head_dim, gpu_name, dropout=drop)
        attn_b = unfused_attention_s(b, s, heads, model.head_dim, gpu_name, backward=True, dropout=drop)
    else:
        attn_f = attention_s(b, s, heads, model.head_dim, gpu_name, kernel=attention)
        attn_b = attention_s(b, s, heads, model.head_dim, gpu_name, backward=True, kernel=attention)
    mem_bytes, kernels = memory_bound_bytes(model, tokens, tp, sequence_parallel, dropout)
    mem_f = memory_s(mem_bytes, gpu_name, kernels)
    mem_b = memory_s(2 * mem_bytes, gpu_name, kernels)
    comm = 2 * allreduce_s(tokens * model.hidden * BF16, tp, gpu_name)  # after attention, after the MLP
    fwd = gemm_f + attn_f + mem_f + comm
    bwd = gemm_b + attn_b + mem_b + comm + (fwd if recompute == "full" else 0.0)
    v = model.vocab / tp
    h = model.hidden
    logits = int(math.ceil(v))
    head_f = gemm_s(tokens, logits, h, gpu_name) + memory_s(12 * tokens * v, gpu_name, 3)  # cross-entropy in fp32
    head_w = gemm_s(h, logits, tokens, gpu_name)
    head_b = gemm_s(tokens, h, logits, gpu_name) + head_w + memory_s(8 * tokens * v, gpu_name, 2)
    o = overhead
    return LayerTimes(o * fwd, o * bwd, o * comm * (2 + (1 if recompute == "full" else 0)), o * head_f, o * head_b,
                      {"gemm": o * gemm_f, "attention": o * attn_f, "memory": o * mem_f, "comm": o * comm},
                      o * gemm_w, o * head_w)


def model_flops_per_token(model: ModelConfig, seq: int) -> float:
    """Model FLOPs of training one token (forward and backward, no recomputation): 3x the forward's
    matmuls and attention (Megatron's non-causal count) plus the logits."""
    return 3.0 * (model.layers * model.layer_fwd_flops(1, seq) + model.logits_fwd_flops(1))

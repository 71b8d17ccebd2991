"""Published training throughputs (bench/data/published_training.csv) and the operator model's
prediction of each row: one iteration of the row's layout, from `costs/operators.py`.

An iteration of a row: m = global_batch / (dp x microbatch) microbatches through a pipeline of pp
stages (L/pp layers each, the output head on the last), with the pipeline bubble of the row's schedule
((pp - 1) / v stage times, v = virtual stages, 1 for plain 1F1B); the data-parallel gradient
all-reduce after it, exposed, over the row's inter-node network (FSDP: per microbatch, as
`fsdp_microbatch_s` says); then the AdamW step. Every time is multiplied by
`overhead` (1: the operators alone), the one constant the bench fits, on one source only.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from testbed.costs.collectives import ring_latency_s
from testbed.costs.gpu_specs import compute_spec
from testbed.costs.gpus import GPUS
from testbed.costs.models import ModelConfig
from testbed.costs.operators import ATTENTION_KERNELS, COMPUTE_OVERHEAD, layer_times, model_flops_per_token
from testbed.costs.stage import optimizer_step_s
from testbed.errors import SpecError

# inter-node bandwidth per GPU (one direction): one 200 Gbit/s HDR NIC per A100 (Selene, DGX A100),
# one 400 Gbit/s NIC per H100 (DGX H100, Llama 3's RoCE fabric). A collective across nodes runs one ring
# per NIC and the node's 8 GPUs share each ring's data over NVLink, so its bus bandwidth is the node's
# NICs together (at NIC_EFF), capped by NVLink.
NIC_BYTES_S = {"A100": 25e9, "H100": 50e9}
NIC_EFF = 0.9
GPUS_PER_NODE = 8
BF16_BYTES = 2
# the CSV's `sharding`: FSDP FULL_SHARD under BACKWARD_POST (Composer's default), under BACKWARD_PRE, and
# SHARD_GRAD_OP (the forward's gathered weights kept for the backward); anything else: no FSDP
FSDP_BACKWARD = {"fsdp": "post", "fsdp_pre": "pre", "fsdp_grad_op": "kept"}
FSDP_MODES = frozenset(FSDP_BACKWARD)


def busbw_bytes_s(gpu: str, gpus: int) -> float:
    """Bus bandwidth of a data-parallel collective over `gpus` GPUs (NVLink alone inside one node)."""
    nvlink = GPUS[gpu].nvlink_bytes_per_s * compute_spec(gpu).nvlink_eff
    if gpus <= GPUS_PER_NODE:
        return nvlink
    return min(nvlink, GPUS_PER_NODE * NIC_BYTES_S.get(gpu, 50e9) * NIC_EFF)


@dataclass(frozen=True)
class Row:
    source: str
    model: ModelConfig
    gpu: str
    gpus: int
    tp: int
    pp: int
    dp: int
    global_batch: int
    microbatch: int
    recompute: str
    virtual_stages: int
    sequence_parallel: bool
    fsdp: bool
    measured: float
    unit: str
    attention: str = "best"  # the attention kernel the stack ran (operators.ATTENTION_KERNELS)
    end_layers: int = 0  # layers on the first and on the last stage where the row gives them (0: L / pp everywhere)
    dropout: bool | None = None  # whether the model ran dropout (None: GPT-style models do, gated ones not)
    fsdp_backward: str = "post"  # FSDP's backward gathers: `post` (BACKWARD_POST), `pre` (BACKWARD_PRE), `kept`


def _flag(text: str) -> bool | None:
    if text not in ("", "True", "False"):
        raise ValueError(text)
    return None if text == "" else text == "True"


def load_rows(path: str | Path) -> list[Row]:
    out = []
    with open(path, newline="") as f:
        for line, r in enumerate(csv.DictReader(f), start=2):
            try:
                m = ModelConfig(r["model"], int(r["layers"]), int(r["hidden"]), int(r["heads"]), int(r["kv_heads"]),
                                int(r["ffn_hidden"]), int(r["vocab"]), int(r["seq"]), r["gated_mlp"] == "True")
                out.append(Row(r["source"], m, r["gpu"], int(r["gpus"]), int(r["tp"]), int(r["pp"]), int(r["dp"]),
                               int(r["global_batch"]), int(r["microbatch"]), r["recompute"],
                               int(r["virtual_stages"] or 1), r["sequence_parallel"] == "True",
                               r["sharding"] in FSDP_MODES,
                               float(r["measured"]), r["unit"], r.get("attention") or "best",
                               int(r.get("end_layers") or 0), _flag(r.get("dropout") or ""),
                               FSDP_BACKWARD.get(r["sharding"], "post")))
                if out[-1].attention not in ATTENTION_KERNELS or r["sharding"] not in ("", *FSDP_MODES):
                    raise ValueError(r["attention"], r["sharding"])
            except (KeyError, ValueError):
                raise SpecError(f"{path}:{line}", "a missing, non-numeric or unknown field",
                                f"fix or remove the row (attention: {', '.join(ATTENTION_KERNELS)}; sharding: empty "
                                f"or {', '.join(sorted(FSDP_MODES))})") from None
    return out


def fsdp_microbatch_s(compute_s: float, params: float, dp: int, bw_bytes_s: float, backward: str = "post",
                      units: int = 1) -> float:
    """One microbatch under PyTorch FSDP (gradients synced every microbatch: Composer's no_sync applies to DDP
    only) over `units` FSDP units (wrapped blocks). FULL_SHARD gathers each unit's bf16 weights for the
    forward and again for the backward; SHARD_GRAD_OP (`backward="kept"`) keeps the forward's; the gradients
    are reduce-scattered (the same bytes as a gather). The forward's gathers run ahead of compute (the CPU
    issues the next unit's while the GPU computes). `backward="post"` (BACKWARD_POST, Composer's default)
    issues a unit's backward gather only after the unit above finished its gradients, so the backward waits
    for every gather: one whole-model gather per microbatch exposed. `pre` (BACKWARD_PRE) issues it before,
    hidden like the forward's. Collectives that need longer than compute bound the microbatch. Every
    collective also pays its ring latency (`collectives.ring_latency_s`: linear in dp) on the critical
    path; only its bandwidth part overlaps compute (docs/compute.md: why)."""
    if backward not in ("post", "pre", "kept"):
        raise ValueError(f"fsdp backward {backward!r}: use post, pre or kept")
    gather_s = params * BF16_BYTES * (dp - 1) / dp / bw_bytes_s
    per_unit = 2 if backward == "kept" else 3
    latency_s = per_unit * units * ring_latency_s(dp, min(dp, GPUS_PER_NODE))
    return max(compute_s + (gather_s if backward == "post" else 0.0), per_unit * gather_s) + latency_s


def iteration_s(row: Row, overhead: float = COMPUTE_OVERHEAD) -> float:
    """Predicted time of one training iteration of `row`'s layout."""
    m_cfg = row.model
    lt = layer_times(m_cfg, row.gpu, tp=row.tp, microbatch=row.microbatch, recompute=row.recompute,
                     sequence_parallel=row.sequence_parallel, attention=row.attention, dropout=row.dropout,
                     overhead=1.0)
    m = row.global_batch / (row.dp * row.microbatch)
    layer = lt.fwd_s + lt.bwd_s
    stage = m_cfg.layers / row.pp * layer
    if row.end_layers and row.pp > 2:  # the ends hold fewer layers (they hold the embedding and the head)
        middle = (m_cfg.layers - 2 * row.end_layers) / (row.pp - 2) * layer
        last = max(middle, row.end_layers * layer + lt.head_fwd_s + lt.head_bwd_s)
    else:
        last = stage + lt.head_fwd_s + lt.head_bwd_s
    compute = m * last + (row.pp - 1) / row.virtual_stages * stage
    params = m_cfg.total_params() / (row.tp * row.pp)
    bw = busbw_bytes_s(row.gpu, row.dp * row.tp)
    if row.fsdp:
        compute = m * fsdp_microbatch_s(compute / m, params, row.dp, bw, row.fsdp_backward,
                                         units=m_cfg.layers + 1)  # a unit per block, the root's embedding
        shard = params / row.dp
        grad = 0.0
    else:
        grad = 2 * (row.dp - 1) / row.dp * params * 2 / bw if row.dp > 1 else 0.0
        shard = params / row.dp  # Megatron's distributed optimizer
    return overhead * (compute + grad + optimizer_step_s(shard, GPUS[row.gpu]))


def narayanan_flops(row: Row) -> float:
    """FLOPs of one iteration as Narayanan et al. 2021 count them (recomputation included): 96 B s l h^2
    (1 + s / 6h + V / 16 l h)."""
    m = row.model
    s, h, lay, v = m.seq_len, m.hidden, m.layers, m.vocab
    return 96.0 * row.global_batch * s * lay * h * h * (1 + s / (6 * h) + v / (16 * lay * h))


def predicted(row: Row, overhead: float = COMPUTE_OVERHEAD) -> float:
    """The prediction in the row's own unit."""
    t = iteration_s(row, overhead)
    tokens = row.global_batch * row.model.seq_len
    if row.unit == "tokens_per_s_per_gpu":
        return tokens / t / row.gpus
    if row.unit == "tflops_per_gpu_hfu":
        return narayanan_flops(row) / t / row.gpus / 1e12
    if row.unit == "tflops_per_gpu_mfu":
        return tokens * model_flops_per_token(row.model, row.model.seq_len) / t / row.gpus / 1e12
    raise SpecError("unit", f"unknown unit {row.unit!r}", "use tokens_per_s_per_gpu or tflops_per_gpu_hfu/_mfu")

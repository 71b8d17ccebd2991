"""Megatron-Core's distributed optimizer with overlap, as a lowering rule: which steps a stage's program gains.

Megatron-Core's DistributedDataParallel splits a model chunk's gradients into buckets of `bucket_size`
parameters, filled in the order the backward produces them (the last layers first), and reduce-scatters each
bucket as soon as the last microbatch's backward has produced all of it (`overlap_grad_reduce`), while the
backward goes on; the distributed optimizer then steps on its shard and all-gathers the updated parameters
bucket by bucket, the first layers' first, while the next iteration's forward starts (`overlap_param_gather`).
Its default bucket is max(40M, 1M x dp) parameters (megatron/core/distributed/distributed_data_parallel_config.py,
`bucket_size`); each TP rank buckets its own shard, so a group (tp GPUs) carries tp times that.

The backward produces a stage's gradients as stretches (`Segment`): the output head's first (the last stage;
taken as instant, its compute is small beside the layers'), the transformer layers' evenly over the backward,
the input embedding's last (the first stage); the forward uses the parameters in the opposite order.
"""

from __future__ import annotations

import math

from testbed.costs.stage import BF16
from testbed.program import AllGather, AllReduce, Await, ReduceScatter

MEGATRON_BUCKET_PARAMS = 40_000_000  # max(40M, 1M x dp) parameters per bucket
MEGATRON_BUCKET_PARAMS_PER_REPLICA = 1_000_000


def bucket_bytes(bucket_params: int | None, dp: int, tp: int) -> float:
    """Gradient bytes (bf16) of one bucket per group: `bucket_params` per GPU, or Megatron-Core's default."""
    params = bucket_params or max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_REPLICA * dp)
    return float(params * tp * BF16)


def split(grad_bytes: float, bucket: float) -> list[float]:
    """A stage's gradient bytes as buckets in backward order: full buckets from the last layers, the rest in the
    last (the first layers)."""
    if grad_bytes <= 0:
        return []
    if bucket <= 0 or bucket >= grad_bytes:
        return [grad_bytes]
    n = math.ceil(grad_bytes / bucket * (1 - 1e-12))
    return [bucket] * (n - 1) + [grad_bytes - bucket * (n - 1)]


Segment = tuple[float, float]  # (bytes, seconds): a stretch of a pass that handles these bytes in this time


def backward_segments(grad_bytes: float, edges: tuple[float, float], bwd_s: float) -> list[Segment]:
    """A stage's backward as it produces gradients: the head's (instant), the layers' (the whole backward), the
    embedding's (instant). `edges`: (input embedding, output head) bytes on the stage."""
    emb, head = edges
    return [(head, 0.0), (max(0.0, grad_bytes - emb - head), bwd_s), (emb, 0.0)]


def forward_segments(grad_bytes: float, edges: tuple[float, float], fwd_s: float) -> list[Segment]:
    """A stage's forward as it uses parameters: the embedding's, the layers', the head's."""
    return backward_segments(grad_bytes, edges, fwd_s)[::-1]


def time_at(segments: list[Segment], x: float) -> float:
    """When a pass has gone through the first `x` bytes of its segments."""
    t = 0.0
    for nbytes, secs in segments:
        if x <= nbytes:
            return t + (secs * x / nbytes if nbytes > 0 else 0.0)
        x -= nbytes
        t += secs
    return t


def reduce_scatters(ar: AllReduce, buckets: list[float], backward: list[Segment]) -> list[ReduceScatter]:
    """The last backward's reduce-scatters, to go just before it: bucket b is issued once the backward has
    produced buckets 0..b."""
    done, out = 0.0, []
    for b, nbytes in enumerate(buckets):
        done += nbytes
        out.append(ReduceScatter(b, time_at(backward, done * (1 - 1e-12)), ar.algorithm, nbytes, ar.rings,
                                 ar.wan_connections, ar.wan_window_bytes))
    return out


def all_gathers(ar: AllReduce, buckets: list[float]) -> list[AllGather]:
    """The parameter all-gathers, first layers first (the program's first steps): each among its group's DC's
    groups (hierarchical) or around the whole ring. The stage's groups share the steps (`rings`: every DC's)."""
    rings = ar.rings if ar.algorithm == "hierarchical" else (tuple(g for r in ar.rings for g in r),)
    return [AllGather(b, buckets[b], rings) for b in reversed(range(len(buckets)))]


def gather_waits(buckets: list[float], forward: list[Segment]) -> list[Await]:
    """The first forward's waits: it reaches bucket b once it has gone through the buckets before it in forward
    order (the later buckets in backward order), so it may start that long before b is in."""
    out, before = [], 0.0
    for b in reversed(range(len(buckets))):
        out.append(Await("AllGather", b, time_at(forward, before)))
        before += buckets[b]
    return out


def scatter_waits(buckets: list[float]) -> list[Await]:
    """The end of the program: every reduce-scatter done before the optimizer steps."""
    return [Await("ReduceScatter", b) for b in range(len(buckets))]

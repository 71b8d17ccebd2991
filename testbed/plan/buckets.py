"""Megatron-Core's distributed optimizer with overlap, as a lowering rule: which steps a stage's program gains.

Megatron-Core's DistributedDataParallel splits a model chunk's gradients into buckets of `bucket_size`
parameters, filled in the order the backward produces them (the last layers first), and reduce-scatters each
bucket as soon as the last microbatch's backward has produced all of it (`overlap_grad_reduce`), while the
backward goes on; the distributed optimizer then steps on its shard and all-gathers the updated parameters
bucket by bucket, the first layers' first, while the next iteration's forward starts (`overlap_param_gather`).
Its default bucket is max(40M, 1M x dp) parameters (megatron/core/distributed/distributed_data_parallel_config.py,
`bucket_size`); each TP rank buckets its own shard, so a group (tp GPUs) carries tp times that.

A bucket's gradients are taken to come out of the backward in proportion to its bytes (its layers' share of
the stage's parameters), and the forward to use a bucket's parameters from the point where its bytes start.
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


def reduce_scatters(ar: AllReduce, buckets: list[float], bwd_s: float) -> list[ReduceScatter]:
    """The last backward's reduce-scatters, to go just before it: bucket b is issued when the backward has
    produced buckets 0..b, that share of `bwd_s` into it."""
    total, done, out = sum(buckets), 0.0, []
    for b, nbytes in enumerate(buckets):
        done += nbytes
        out.append(ReduceScatter(b, bwd_s * min(1.0, done / total), ar.algorithm, nbytes, ar.rings,
                                 ar.wan_connections, ar.wan_window_bytes))
    return out


def all_gathers(ar: AllReduce, buckets: list[float]) -> list[AllGather]:
    """The parameter all-gathers, first layers first (the program's first steps): each among its group's DC's
    groups (hierarchical) or around the whole ring. The stage's groups share the steps (`rings`: every DC's)."""
    rings = ar.rings if ar.algorithm == "hierarchical" else (tuple(g for r in ar.rings for g in r),)
    return [AllGather(b, buckets[b], rings) for b in reversed(range(len(buckets)))]


def gather_waits(buckets: list[float], fwd_s: float) -> list[Await]:
    """The first forward's waits: bucket b's layers start after the forward has run through the buckets before
    it in forward order (the later buckets in backward order), so it may start that long before b is in."""
    total = sum(buckets)
    out, before = [], 0.0
    for b in reversed(range(len(buckets))):
        out.append(Await("AllGather", b, fwd_s * before / total))
        before += buckets[b]
    return out


def scatter_waits(buckets: list[float]) -> list[Await]:
    """The end of the program: every reduce-scatter done before the optimizer steps."""
    return [Await("ReduceScatter", b) for b in range(len(buckets))]

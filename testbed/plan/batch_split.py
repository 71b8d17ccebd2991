"""The global batch split over data-parallel replicas by their speed (`workload.batch_split: speed`).

Sailor (Strati et al., 2025, "Sailor: Automating Distributed Training over Dynamic, Heterogeneous, and
Geo-distributed Clusters", SOSP '25) gives data-parallel replicas of unlike speed unlike shares of the global
batch, so that they finish their gradient accumulation together and no site waits for the slowest. Here a
replica's share is a whole number of microbatches, and its time for m of them is its pipeline's: every stage
once (fill and drain) and the slowest stage once per further microbatch. Microbatches go one at a time to the
replica that would finish its share soonest with one more (ties to the lower replica): the split whose slowest
replica is fastest, and the even split for replicas alike.
"""

from __future__ import annotations

import heapq


def pipeline_s(stage_s: list[float], microbatches: int) -> float:
    """One replica's forward and backward of `microbatches` through stages taking `stage_s` each per
    microbatch: the first fills and drains the pipeline, the rest follow at its slowest stage's pace."""
    return sum(stage_s) + (microbatches - 1) * max(stage_s)


def split_by_speed(total: int, stage_s: list[list[float]]) -> list[int]:
    """[replica] -> microbatches, summing to `total`, at least one each; `stage_s`: [replica][stage] one
    microbatch's forward plus backward. Raises ValueError with fewer microbatches than replicas."""
    if total < len(stage_s):
        raise ValueError(f"{total} microbatches cannot give each of {len(stage_s)} replicas one")
    shares = [1] * len(stage_s)
    heap = [(pipeline_s(t, 2), r) for r, t in enumerate(stage_s)]
    heapq.heapify(heap)
    for _ in range(total - len(stage_s)):
        _, r = heapq.heappop(heap)
        shares[r] += 1
        heapq.heappush(heap, (pipeline_s(stage_s[r], shares[r] + 1), r))
    return shares

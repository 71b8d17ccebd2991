"""Latency of NCCL's ring collectives across nodes, from NCCL's own cost model.

NCCL picks an algorithm by predicting each one's time as a latency plus bytes over a bandwidth
(`src/graph/tuning.cc` of NVIDIA/nccl, 2.18 and later: `baseLat`, `hwLat`). A ring all-gather or
reduce-scatter over n ranks on N nodes, Simple protocol (the one it picks for large messages), takes a
base latency plus one hop latency per ring step: n - N steps over NVLink, N - 1 over the network. It
grows linearly with the ranks ("The latency of ring increases linearly with the communicator size",
NCCL maintainers, NVIDIA/nccl issue #1712); NCCL 2.23's PAT algorithm exists to cut it.
"""

from __future__ import annotations

import math

RING_BASE_S = 8.4e-6  # baseLat, Ring / Simple
RING_NVLINK_HOP_S = 3.4e-6  # hwLat NVLink, Ring / Simple
RING_NET_HOP_S = 14.0e-6  # hwLat NET, Ring / Simple


def ring_latency_s(ranks: int, ranks_per_node: int) -> float:
    """Latency of one ring all-gather or reduce-scatter over `ranks` GPUs, `ranks_per_node` per node."""
    if ranks <= 1:
        return 0.0
    if ranks_per_node < 1:
        raise ValueError(f"ranks_per_node {ranks_per_node}: at least 1")
    nodes = math.ceil(ranks / ranks_per_node)
    return RING_BASE_S + (ranks - nodes) * RING_NVLINK_HOP_S + (nodes - 1) * RING_NET_HOP_S

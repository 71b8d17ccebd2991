"""Layers per pipeline stage: by each stage's GPU speed and free memory (as Sailor, SOSP'25, does).

A stage on a slower GPU gets fewer layers, a stage whose memory is short (more in-flight activations,
the embedding, the output head) gets no more than it holds. The even split is kept whenever the
balanced one is no faster, so jobs on one GPU type keep their usual layout.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from testbed.costs.stage import LayerCosts, in_flight, split_layers


def balance_layers(total: int, layer_s: Sequence[float], fixed_s: Sequence[float], room: Sequence[int]
                   ) -> list[int] | None:
    """Layers per stage minimising the slowest stage's time `n * layer_s + fixed_s`, with at most
    `room` layers per stage and at least one each; None if they cannot hold `total`.

    Greedy: each next layer goes to the stage that would be done with it soonest among those with room.
    For identical jobs on machines of different speeds this is optimal (an exchange argument).
    """
    pp = len(layer_s)
    if total < pp or any(r < 1 for r in room) or sum(room) < total:
        return None
    n = [1] * pp
    heap = [(2 * layer_s[s] + fixed_s[s], s) for s in range(pp) if room[s] > 1]
    heapq.heapify(heap)
    for _ in range(total - pp):
        t, s = heapq.heappop(heap)
        n[s] += 1
        if n[s] < room[s]:
            heapq.heappush(heap, (t + layer_s[s], s))
    return n


def slowest(layers: Sequence[int], layer_s: Sequence[float], fixed_s: Sequence[float]) -> float:
    return max(n * t + f for n, t, f in zip(layers, layer_s, fixed_s, strict=True))


def stage_layers(total: int, stage_costs: Sequence[Sequence[LayerCosts]], microbatches: int, schedule: str,
                 mode: str = "auto", virtual_stages: int = 1) -> tuple[list[int], bool]:
    """Layers per stage and whether they fit in memory. `stage_costs[s]` are the layer costs of every
    GPU type that runs stage s (one, unless replicas of a stage sit in DCs of different GPUs: then the
    slowest and the smallest count)."""
    pp = len(stage_costs)
    layer_s = [max(c.layer_s for c in cs) for cs in stage_costs]
    fixed_s = [max(c.head_fwd_s + c.head_bwd_s for c in cs) if s == pp - 1 else 0.0
               for s, cs in enumerate(stage_costs)]
    room = [min(c.max_layers(s == 0, s == pp - 1, in_flight(s, pp, microbatches, schedule, virtual_stages))
                for c in cs)
            for s, cs in enumerate(stage_costs)]
    return choose_layers(total, layer_s, fixed_s, room, mode)


def choose_layers(total: int, layer_s: Sequence[float], fixed_s: Sequence[float], room: Sequence[int],
                  mode: str = "auto") -> tuple[list[int], bool]:
    """The balanced split, or the even one when it fits and is as fast (or `mode` is `even`)."""
    even = split_layers(total, len(layer_s))
    even_fits = all(n <= r for n, r in zip(even, room, strict=True))
    if mode == "even":
        return even, even_fits
    best = balance_layers(total, layer_s, fixed_s, room)
    if best is None:
        return even, False
    if even_fits and slowest(even, layer_s, fixed_s) <= slowest(best, layer_s, fixed_s) * (1 + 1e-9):
        return even, True
    return best, True


def chunk_layers(layers: Sequence[int], v: int) -> list[list[int]]:
    """[stage][chunk] -> layers of each of a stage's v model chunks (virtual stages), as even as possible. The
    first stage's short chunks come first and the last stage's last, so that with one layer fewer on each end
    stage (split_layers) its first chunk holds only the embedding and its last only the output head, as the
    Llama 3 paper describes its layout (Llama Team 2024, section 3.3.2); elsewhere the longer chunks go first."""
    pp, out = len(layers), []
    for s, n in enumerate(layers):
        base, extra = divmod(n, v)
        counts = [base + (1 if c < extra else 0) for c in range(v)]
        out.append(counts[::-1] if s == 0 and pp > 1 else counts)
    return out


def empty_chunk(chunks: Sequence[Sequence[int]]) -> tuple[int, int] | None:
    """The first (stage, chunk) with no layer other than the ends' (the embedding's chunk, the head's), or None."""
    pp = len(chunks)
    for s, row in enumerate(chunks):
        for c, n in enumerate(row):
            if n == 0 and not (s == 0 and c == 0) and not (s == pp - 1 and c == len(row) - 1):
                return s, c
    return None

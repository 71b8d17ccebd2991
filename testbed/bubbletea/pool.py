"""The fallback: a finite pool of dedicated prefill servers with one FIFO queue.

Requests that the bubbles do not serve queue here in arrival order; the request at the head of the
queue takes the first server to come free (among servers free at once, one in its home DC, so its
KV cache need not cross the WAN). TTFT of a pool-served request = its wait in the queue + its
prefill time on the server. A pool smaller than the load it gets makes the queue grow: TTFT then
exceeds the SLO and `slo_attainment` falls below 1.

Sizing (`bubbletea.fallback_gpus`, default `default_servers`): enough servers to carry the trace's
mean load at its own rate (rate_scale 1) alone, ceil(requests/s x mean prefill seconds). A sweep over
`rate_scale` keeps that pool fixed, so the load beyond it must fit in the bubbles or queue.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Server:
    dc: str
    prefill_s: Callable[[int], float]  # prompt tokens -> seconds on this server
    free_at: float = 0.0
    busy_s: float = 0.0


@dataclass(frozen=True)
class Served:
    server: int
    dc: str
    start_s: float
    end_s: float

    def queue_s(self, arrival_s: float) -> float:
        return self.start_s - arrival_s


class FallbackPool:
    """Servers spread round-robin over `dcs`, each running the inference model on `gpus_per_server` GPUs."""

    def __init__(self, servers: int, gpus_per_server: int, dcs: list[str],
                 prefill_s: dict[str, Callable[[int], float]]) -> None:
        if servers < 1:
            raise ValueError("a fallback pool needs at least one server")
        self.gpus_per_server = gpus_per_server
        self.servers = [Server(dcs[i % len(dcs)], prefill_s[dcs[i % len(dcs)]]) for i in range(servers)]

    @property
    def gpus(self) -> int:
        return len(self.servers) * self.gpus_per_server

    def peek(self, arrival_s: float, tokens: int, home: str) -> Served:
        """Where and when the request would be served if it joined the queue now (requests join in
        arrival order, so the queue ahead of it is exactly what the servers still hold)."""
        best: tuple | None = None
        for i, s in enumerate(self.servers):
            start = max(arrival_s, s.free_at)
            key = (start, s.dc != home, i)
            if best is None or key < best:
                best = key
        start, _, i = best  # type: ignore[misc]
        s = self.servers[i]
        return Served(i, s.dc, start, start + s.prefill_s(tokens))

    def commit(self, served: Served) -> None:
        s = self.servers[served.server]
        s.free_at = served.end_s
        s.busy_s += served.end_s - served.start_s

    def serve(self, arrival_s: float, tokens: int, home: str) -> Served:
        served = self.peek(arrival_s, tokens, home)
        self.commit(served)
        return served

    def busy_share(self, horizon_s: float) -> float:
        """Share of the pool's server time spent prefilling over the horizon (can exceed the horizon's
        end when the queue outlives it; capped at 1)."""
        if horizon_s <= 0:
            return 0.0
        return min(1.0, sum(s.busy_s for s in self.servers) / (len(self.servers) * horizon_s))


def default_servers(native_rate_per_s: float, mean_prefill_s: float) -> int:
    """Servers that carry the trace's mean load at its own rate alone: ceil(rate x mean prefill time)."""
    return max(1, math.ceil(native_rate_per_s * mean_prefill_s - 1e-9))

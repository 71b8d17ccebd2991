"""Flow-level model of one direction of a WAN link.

Each active transfer (flow) has a cap (n connections x window / RTT). The link divides its
capacity among active flows in one of two ways:

- spatial (today's default): max-min fair water-filling, so k equal flows get C/k each;
- temporal (Atlas): flows take turns in priority order; the first gets min(cap, C), the next gets
  what is left, and so on. With n x W/RTT >= C that is one flow at a time at full rate.

Rates change only when a flow starts or ends; flows whose rate did not change keep their pending
completion event, so a cap-bound flow costs nothing when others come and go.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False)
class Flow:
    nbytes: float
    cap: float  # bytes/s this flow could carry alone
    prio: tuple  # lower first under temporal sharing
    payload: object = None
    remaining: float = field(init=False)
    rate: float = 0.0
    t_last: float = 0.0
    version: int = 0
    start: float = 0.0

    def __post_init__(self) -> None:
        self.remaining = self.nbytes


def allocate_spatial(capacity: float, flows: list[Flow]) -> list[float]:
    """Max-min fair rates with per-flow caps (water-filling); in the order of `flows`."""
    order = sorted(range(len(flows)), key=lambda i: flows[i].cap)
    rates = [0.0] * len(flows)
    left, n = capacity, len(flows)
    for k, i in enumerate(order):
        share = left / (n - k)
        r = min(flows[i].cap, share)
        rates[i] = r
        left -= r
    return rates


def allocate_temporal(capacity: float, flows: list[Flow]) -> list[float]:
    """Strict turns: capacity goes to flows in priority order, each up to its cap."""
    order = sorted(range(len(flows)), key=lambda i: flows[i].prio)
    rates = [0.0] * len(flows)
    left = capacity
    for i in order:
        r = min(flows[i].cap, left)
        rates[i] = r
        left -= r
        if left <= 0:
            break
    return rates


class LinkState:
    """Active flows on one link direction; calls `schedule(t, flow, version)` for completions."""

    def __init__(self, capacity: float, temporal: bool, schedule: Callable[[float, Flow, int], None]) -> None:
        self.capacity = capacity
        self.temporal = temporal
        self.schedule = schedule
        self.flows: list[Flow] = []
        self.bytes_total = 0.0

    def add(self, flow: Flow, now: float) -> None:
        flow.t_last = now
        flow.start = now
        self.bytes_total += flow.nbytes
        self.flows.append(flow)
        self._reallocate(now)

    def remove(self, flow: Flow, now: float) -> None:
        self.flows.remove(flow)
        flow.remaining = 0.0
        self._reallocate(now)

    def _reallocate(self, now: float) -> None:
        flows = self.flows
        if not flows:
            return
        for f in flows:
            if f.rate:
                f.remaining = max(0.0, f.remaining - f.rate * (now - f.t_last))
            f.t_last = now
        rates = (allocate_temporal if self.temporal else allocate_spatial)(self.capacity, flows)
        for f, r in zip(flows, rates, strict=True):
            if r == f.rate and f.version:
                continue  # unchanged: its completion event still holds
            f.rate = r
            f.version += 1
            if r > 0:
                self.schedule(now + (f.remaining / r if math.isfinite(r) else 0.0), f, f.version)

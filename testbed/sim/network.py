"""Flow-level model of one direction of a WAN link.

Each active transfer (flow) has a cap (n connections x window / RTT). The link divides its
capacity among active flows in one of two ways:

- spatial (today's default): max-min fair water-filling, so k equal flows get C/k each;
- temporal (Atlas): flows take turns in priority order; the first gets min(cap, C), the next gets
  what is left, and so on. With n x W/RTT >= C that is one flow at a time at full rate.

A flow may stand for `weight` identical copies (replicas the executor proved symmetric): it gets
what each copy would, and counts `weight` times in the sharing.

A link may change while flows are on it (testbed/sim/linkchange.py): `set_capacity` re-rates them (capacity 0
is a failed link: every flow stalls at rate 0 and resumes when capacity returns) and `set_rtt` re-caps them
(a flow's cap is the bytes its connections keep in flight, `window`, over the RTT).

Rates change only when a flow starts or ends or the link changes, and only flows whose rate changed get a new completion
event, so a cap-bound flow costs nothing when others come and go. Under temporal sharing the flows
are kept in priority order and only the ones that get capacity are visited, so a long queue of
waiting flows costs nothing per event either.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class Flow:
    nbytes: float  # bytes of one copy
    cap: float  # bytes/s one copy could carry alone
    prio: tuple  # lower first under temporal sharing
    payload: object = None
    weight: int = 1  # identical copies this flow stands for
    remaining: float = field(init=False)
    rate: float = 0.0  # bytes/s of one copy
    t_last: float = 0.0
    version: int = 0
    start: float = 0.0
    seq: int = 0  # arrival order on its link: breaks priority ties deterministically
    window: float = math.inf  # bytes its connections keep in flight (n x W): its cap is window / RTT

    def __post_init__(self) -> None:
        self.remaining = self.nbytes


def allocate_spatial(capacity: float, flows: list[Flow]) -> list[float]:
    """Max-min fair rates per copy with per-flow caps (weighted water-filling); in the order of `flows`."""
    order = sorted(range(len(flows)), key=lambda i: flows[i].cap)
    rates = [0.0] * len(flows)
    left, weight = capacity, sum(f.weight for f in flows)
    for i in order:
        f = flows[i]
        r = min(f.cap, left / weight)
        rates[i] = r
        left -= r * f.weight
        weight -= f.weight
    return rates


def allocate_temporal(capacity: float, flows: list[Flow]) -> list[float]:
    """Strict turns: capacity goes to flows in priority order, each up to its cap."""
    order = sorted(range(len(flows)), key=lambda i: (flows[i].prio, flows[i].seq))
    rates = [0.0] * len(flows)
    left = capacity
    for i in order:
        if left <= 0:
            break
        f = flows[i]
        r = min(f.cap, left / f.weight)
        rates[i] = r
        left -= r * f.weight
    return rates


class LinkState:
    """Active flows on one link direction; calls `schedule(t, flow, version)` for completions."""

    def __init__(self, capacity: float, temporal: bool, schedule: Callable[[float, Flow, int], None]) -> None:
        self.capacity = capacity
        self.temporal = temporal
        self.schedule = schedule
        self.flows: list[Flow] = []  # spatial: every active flow; temporal: sorted by (prio, seq)
        self.keys: list[tuple] = []  # temporal: the sort keys of `flows`
        self.running: list[Flow] = []  # temporal: the flows that get capacity now, in priority order
        self.bytes_total = 0.0
        self.arrivals = 0
        self.on_change: Callable[[float, LinkState], None] | None = None  # told after every re-rating

    def add(self, flow: Flow, now: float) -> None:
        flow.t_last = now
        flow.start = now
        self.arrivals += 1
        flow.seq = self.arrivals
        self.bytes_total += flow.nbytes * flow.weight
        if self.temporal:
            key = (flow.prio, flow.seq)
            i = bisect.bisect(self.keys, key)
            self.keys.insert(i, key)
            self.flows.insert(i, flow)
        else:
            self.flows.append(flow)
        self._reallocate(now)

    def remove(self, flow: Flow, now: float) -> None:
        if self.temporal:
            i = bisect.bisect_left(self.keys, (flow.prio, flow.seq))
            del self.keys[i]
            del self.flows[i]
        else:
            self.flows.remove(flow)
        flow.remaining = 0.0
        flow.rate = 0.0
        self._reallocate(now)

    def reprioritize(self, flow: Flow, prio: tuple, now: float) -> None:
        """Move an active flow to a new priority (temporal sharing: the sidecar re-ranked its replica)."""
        if flow.prio == prio:
            return
        if not self.temporal:
            flow.prio = prio
            return
        i = bisect.bisect_left(self.keys, (flow.prio, flow.seq))
        del self.keys[i]
        del self.flows[i]
        flow.prio = prio
        j = bisect.bisect(self.keys, (prio, flow.seq))
        self.keys.insert(j, (prio, flow.seq))
        self.flows.insert(j, flow)
        self._reallocate(now)

    def set_capacity(self, now: float, capacity: float) -> None:
        """The link's rate changes now (0: it failed); the flows on it are re-rated."""
        self.capacity = capacity
        self._reallocate(now)

    def set_rtt(self, now: float, rtt_s: float) -> None:
        """The link's round trip changes now: each flow's window-bound cap follows, then flows are re-rated."""
        for f in self.flows:
            f.cap = f.window / rtt_s if rtt_s > 0 else math.inf
        self._reallocate(now)

    def throughput(self) -> float:
        """Bytes/s the link carries now, all copies counted."""
        return sum((f.rate * f.weight for f in (self.running if self.temporal else self.flows)), 0.0)

    def _set_rate(self, f: Flow, r: float, now: float) -> None:
        if r == f.rate and f.version:
            return  # unchanged: its completion event still holds
        f.rate = r
        f.version += 1
        if r > 0:
            self.schedule(now + (f.remaining / r if math.isfinite(r) else 0.0), f, f.version)

    @staticmethod
    def _advance(flows: list[Flow], now: float) -> None:
        for f in flows:
            if f.rate:
                f.remaining = max(0.0, f.remaining - f.rate * (now - f.t_last))
            f.t_last = now

    def _reallocate(self, now: float) -> None:
        if self.temporal:
            self._reallocate_turns(now)
        elif self.flows:
            self._reallocate_fair(now)
        if self.on_change is not None:
            self.on_change(now, self)

    def _reallocate_fair(self, now: float) -> None:
        flows = self.flows
        self._advance(flows, now)
        for f, r in zip(flows, allocate_spatial(self.capacity, flows), strict=True):
            self._set_rate(f, r, now)

    def _reallocate_turns(self, now: float) -> None:
        """Visit flows in priority order until the capacity is used up; the flows that ran before and no
        longer get capacity are paused. (_advance and _set_rate inlined: this runs at every flow's start
        and end under temporal sharing.)"""
        before = self.running
        for f in before:
            if f.rate:
                x = f.remaining - f.rate * (now - f.t_last)
                f.remaining = x if x > 0.0 else 0.0
            f.t_last = now
        running: list[Flow] = []
        left = self.capacity
        schedule = self.schedule
        for f in self.flows:
            if left <= 0:
                break
            rate = f.rate
            if not rate:
                f.t_last = now
            r = left / f.weight
            if not r < f.cap:
                r = f.cap
            if r != rate or not f.version:
                f.rate = r
                f.version += 1
                if r > 0:
                    schedule(now + (f.remaining / r if r < math.inf else 0.0), f, f.version)
            running.append(f)
            left -= r * f.weight
        if before:
            kept = running if len(running) < 8 else set(running)
            for f in before:
                if f.rate and f not in kept:
                    f.rate = 0.0
                    f.version += 1
        self.running = running


INF = float("inf")


class SlidingWindow:
    """The window of one WAN pipe (its n connections together): at most `window` bytes unacknowledged. Each
    piece a pipe puts on the link is held from when it starts to leave until one round trip later, when the
    acknowledgement of its first byte returns; from then the sender may send it again at the rate it went
    (freeing the piece at once stands for that: exact when the link's share has not changed). A piece that
    took longer than a round trip to send (the link's share, not the window, was the limit) is free as it
    ends. A round-based model (the whole window free again one round trip after a round began) let a
    transfer issued late in a round send a second window at that round's end: up to 9 % fast on pipelines
    whose window-bound transfers follow one another (docs/fidelity.md, "The window slides")."""

    __slots__ = ("window", "rtt_s", "pieces", "held", "last_end")

    def __init__(self, window: float, rtt_s: float) -> None:
        self.window, self.rtt_s = window, rtt_s
        self.pieces: deque[tuple[float, float]] = deque()  # (when it started to leave, bytes), oldest first
        self.held = 0.0
        self.last_end = -INF  # when the pipe's last piece finished leaving

    def budget(self, now: float) -> float:
        """Bytes the pipe may send now without waiting: the window less the pieces not yet acknowledged."""
        pieces, rtt = self.pieces, self.rtt_s
        while pieces and pieces[0][0] + rtt <= now:
            self.held -= pieces.popleft()[1]
        if not pieces:
            self.held = 0.0  # no rounding left over
        return self.window - self.held

    def sent(self, now: float, nbytes: float) -> None:
        """A piece of `nbytes` starts to leave now. One that follows the last piece without a gap joins it: the
        bytes of one stream come back at the rate they went, which freeing the joined piece at once stands for
        as it does for one piece, and a pipe that sends each freed piece again as its own would split its
        window into ever more pieces (one per transfer: 31 k events became 966 k on a GPipe job with 512
        microbatches, the iteration time unchanged)."""
        pieces = self.pieces
        if pieces and now == self.last_end:
            t, b = pieces[-1]
            pieces[-1] = (t, b + nbytes)
        else:
            pieces.append((now, nbytes))
        self.held += nbytes

    def ended(self, now: float) -> None:
        """The piece on the link has finished leaving."""
        self.last_end = now

    def next_free_s(self) -> float:
        """When the oldest unacknowledged piece comes free."""
        return self.pieces[0][0] + self.rtt_s

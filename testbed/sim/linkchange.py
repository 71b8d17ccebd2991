"""A WAN that changes during a run: each link's schedule of states, and its replay inside a simulation.

A link's schedule comes from the lowered network (testbed/net/links.py NetLink.changes, lowered from the spec's
`trace` points, which set its rate and latency from their time on, and `events`, which take it down for a while, by
testbed/plan/network.py). Times are seconds of training since the first iteration began (the timeline's clock:
iterations back to back, the optimizer step between them untimed), so the simulator and the emulator place a change
at the same point of the same iteration.

`LiveLinks` replays a schedule inside one simulated iteration that starts at `t0`: at each change it calls the
link's `set_capacity` (0 while down: flows stall at rate 0, then resume) and `set_rtt`, and updates the link
plan new transfers are capped by. Transfers in flight keep their connections; the plan of the next iteration
(connection counts, replica stagger, warm-up) is made from the link as it is when that iteration starts
(`states_at`, testbed/runs/simulated.py). It also records each link's throughput and the time transfers spent
stalled on a down link.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from testbed.net.links import NetPlan, Pair, WanState

if TYPE_CHECKING:
    from testbed.plan.plan import LinkPlan
    from testbed.sim.network import LinkState

__all__ = ["LiveLinks", "Pair", "WanSchedule", "WanState", "union_length"]


class WanSchedule:
    """Every changing link's states over time. Links without a schedule are not in it."""

    def __init__(self, links: dict[Pair, tuple[list[float], list[WanState]]]) -> None:
        self.links = links
        # every change after time 0, in time order (link order breaks ties): (t, link index, pair, state)
        self.changes = sorted((t, i, pair, st) for i, (pair, (ts, sts)) in enumerate(links.items())
                              for t, st in zip(ts[1:], sts[1:], strict=True))
        self.change_times = [c[0] for c in self.changes]

    @classmethod
    def from_net(cls, net: NetPlan) -> WanSchedule | None:
        """The lowered network's changing links; None when no link changes: the run is the same iteration repeated."""
        links = {link.between: ([t for t, _ in link.changes], [st for _, st in link.changes])
                 for link in net.links if link.changes}
        return cls(links) if links else None

    def state_at(self, pair: Pair, t: float) -> WanState:
        times, states = self.links[pair]
        return states[bisect.bisect_right(times, t) - 1]

    def after(self, t: float) -> int:
        """Index of the first change later than t."""
        return bisect.bisect_right(self.change_times, t)

    def states_at(self, t: float) -> dict[Pair, WanState]:
        """Every changing link's state at time t (what a plan made then sees: testbed/plan/network.py topology_at)."""
        return {pair: self.state_at(pair, t) for pair in self.links}

    def outages(self) -> list[tuple[Pair, float, float]]:
        """Every down period: (link, from, to)."""
        out = []
        for pair, (times, states) in self.links.items():
            for k, st in enumerate(states):
                if not st.up:
                    out.append((pair, times[k], times[k + 1] if k + 1 < len(times) else float("inf")))
        return out


class Running(Protocol):
    """What LiveLinks reads and calls of a running simulation (sim/executor.py's Simulation), named here so
    that this module needs nothing of the executor."""
    links: dict[Pair, LinkState]
    lp: dict[Pair, LinkPlan]
    now: float

    def push(self, t: float, fn: Callable[..., None], *args: object) -> None: ...

    def pending(self) -> bool: ...


class LiveLinks:
    """Replays a WanSchedule inside one simulated iteration that began at `t0` on the schedule's clock (the
    simulation's own clock starts at 0)."""

    def __init__(self, sim: Running, schedule: WanSchedule, t0: float) -> None:
        self.sim, self.sched, self.t0 = sim, schedule, t0
        self.next = schedule.after(t0)
        self.rates: dict[Pair, list[tuple[float, float]]] = {k: [] for k in sim.links}  # directed: (t, bytes/s)
        self.stalls: list[tuple[float, float]] = []  # (from, to) on the schedule's clock
        self.down_since: dict[Pair, float] = {}  # directed link -> when it went down (simulation clock)
        for key, link in sim.links.items():
            link.on_change = self._record(key)
        for pair in schedule.links:
            self._apply(pair, schedule.state_at(pair, t0), 0.0)

    def _record(self, key: Pair):
        rows = self.rates[key]

        def on_change(now: float, link: LinkState) -> None:
            r = link.throughput()
            if rows and rows[-1][0] == now:  # the last of several re-ratings at one instant counts
                rows[-1] = (now, r)
                if len(rows) > 1 and rows[-2][1] == r:
                    rows.pop()  # back to the rate before this instant: no change to record
            elif not rows or rows[-1][1] != r:
                rows.append((now, r))

        return on_change

    def start(self) -> None:
        self._push_next()

    def _push_next(self) -> None:
        if self.next < len(self.sched.changes):
            self.sim.push(self.sched.changes[self.next][0] - self.t0, self._fire, self.next)

    def _fire(self, k: int) -> None:
        _, _, pair, state = self.sched.changes[k]
        self._apply(pair, state, self.sim.now)
        self.next = k + 1
        if self.sim.pending() or any(link.flows for link in self.sim.links.values()):
            self._push_next()  # the iteration goes on: the next change may matter to it

    def _apply(self, pair: Pair, st: WanState, now: float) -> None:
        sim = self.sim
        a, b = pair
        for key in ((a, b), (b, a)):
            if key not in sim.links:
                continue
            lp = sim.lp[key]
            sim.lp[key] = replace(lp, capacity_bytes_s=st.capacity_bytes_s, latency_s=st.latency_s)
            link = sim.links[key]
            if not st.up and key not in self.down_since:
                self.down_since[key] = now
            elif st.up and key in self.down_since:
                since = self.down_since.pop(key)
                if link.flows:  # they waited from when the link failed, or from when they came, if later
                    waited = max(since, min(f.start for f in link.flows))
                    self.stalls.append((self.t0 + waited, self.t0 + now))
            if st.latency_s != lp.latency_s:
                link.set_rtt(now, 2 * st.latency_s)
            capacity = st.capacity_bytes_s if st.up else 0.0
            if capacity != link.capacity:
                link.set_capacity(now, capacity)

    def link_rates(self) -> dict[Pair, list[tuple[float, float]]]:
        """Per directed link: (time on the schedule's clock, bytes/s) at each change of its throughput."""
        return {k: [(self.t0 + t, r) for t, r in rows] for k, rows in self.rates.items()}


def union_length(intervals: list[tuple[float, float]], lo: float = float("-inf"), hi: float = float("inf")) -> float:
    """Seconds covered by at least one interval, counted inside [lo, hi]."""
    total, end = 0.0, lo
    for a, b in sorted(intervals):
        a, b = max(a, end), min(b, hi)
        if b > a:
            total += b - a
            end = b
    return total


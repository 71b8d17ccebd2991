"""A ring across DCs over the WAN, step by step: the part of a hierarchical collective that crosses the WAN
(DiLoCo's OuterSync, sim/sync.py; a bucket's reduce-scatter, sim/collectives.py).

Each of the D DCs sends 2 (D - 1) steps of 1/D of the bytes to the next DC of the ring. A DC sends its step s
once its step s - 1 has left and step s - 1 of the DC before it has arrived (each exchange waits for the one it
receives, and a DC's sends leave in order on its connections). A step goes out a piece at a time, as much as its
connections' window (n x W) has free, each piece a flow sharing the link with anything else on it; a piece comes
free one round trip after it started to leave (sim/network.py SlidingWindow, as a pipe's), and the window slides
across steps. So a window-bound step of q windows takes about (ceil(q) - 1) round trips + its last window at the
link's rate + a latency, and a step that fits its window or is bound by the link's rate its bytes at that rate +
a latency. Each DC enters the ring on its own (`start_dc`): its first step needs nothing from the others, as a
NCCL rank's first chunk leaves as soon as that rank launches the collective; the steps after it wait for their
predecessor's data as above. A DC's part ends when its last step from the DC before it has arrived: its own last
step is then in its connections' send buffers and leaves from there while the DC goes on (the emulated workers'
sends are queued, runtime/worker.py Striped.send, as NCCL's proxy sends a step the kernel has handed over).
Rings of one communicator (a stage's outer syncs, fragment after fragment) share its connections (`Lane`): their
steps on a hop leave in the order they were ready, one at a time, through one sliding window, so a fragment's first
step waits behind the last step of the fragment before that its DC left to its send buffers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from testbed.sim.network import Flow, SlidingWindow


class Lane:
    """A hop's connections of one communicator: the window they share and the ring whose step is on them now, with
    the steps waiting behind it (FIFO, as one sender's queue)."""

    __slots__ = ("win", "owner", "queue")

    def __init__(self) -> None:
        self.win: SlidingWindow | None = None
        self.owner: WanRing | None = None
        self.queue: deque[tuple[WanRing, int]] = deque()


class WanRing:
    """One ring across DCs in flight. `hops[i]` is DC i's link to the next DC, `connections[i]` the TCP connections
    DC i's share of the ring opens on it; `on_end(ends)` is called once every step has left, with each DC's end
    (its last step received, at or before the last arrival); `on_arrive(i, t)`, if given, as soon as DC i's end t
    is known (when the DC before it has sent its last step). `lanes`: hop -> Lane, shared by the rings of one
    communicator (None: this ring's own)."""

    __slots__ = ("sim", "hops", "connections", "nbytes", "step_bytes", "steps", "prio", "on_end", "on_arrive", "left",
                 "busy", "sent", "arrived", "lanes", "entered")

    def __init__(self, sim, hops: list[tuple[str, str]], connections: tuple[int, ...], nbytes: float, prio: tuple,
                 on_end: Callable[[list[float]], None],
                 on_arrive: Callable[[int, float], None] | None = None,
                 lanes: dict[tuple[str, str], Lane] | None = None) -> None:
        D = len(hops)
        self.sim, self.hops, self.connections, self.prio, self.on_end = sim, hops, connections, prio, on_end
        self.on_arrive = on_arrive
        self.nbytes, self.step_bytes = nbytes, nbytes / D
        self.steps = 2 * (D - 1)
        self.left = [0.0] * D
        self.busy = [False] * D
        self.sent = [0] * D
        self.arrived: list[list[float]] = [[] for _ in range(D)]
        lanes = {} if lanes is None else lanes
        self.lanes = [lanes.setdefault(h, Lane()) for h in hops]
        self.entered = [False] * D

    def start(self, t: float) -> None:
        """Every DC's first step at time t."""
        for i in range(len(self.hops)):
            self.start_dc(i, t)

    def start_dc(self, i: int, t: float) -> None:
        """DC i enters the ring at time t (its first step leaves then)."""
        self.sim.push(t, self._enter, i)

    def _enter(self, i: int) -> None:
        self.entered[i] = True
        self._try_step(i)

    def _try_step(self, i: int) -> None:
        """Start DC i's next step if it may."""
        s = self.sent[i]
        if not self.entered[i] or self.busy[i] or s >= self.steps:
            return
        if s > 0:
            prev = self.arrived[i - 1]  # the DC before: hop i - 1 ends at DC i
            if len(prev) < s:
                return  # hop i - 1's step s - 1 is not out yet; its end starts this one
            if prev[s - 1] > self.sim.now:
                self.sim.push(prev[s - 1], self._try_step, i)
                return
        lane = self.lanes[i]
        if lane.owner is not None:  # another ring's step is on these connections: this one goes after it
            if lane.owner is not self and (self, i) not in lane.queue:
                lane.queue.append((self, i))
            return
        lane.owner = self
        self.busy[i] = True
        self.left[i] = self.step_bytes
        self._piece(i)

    def _piece(self, i: int) -> None:
        """As much of hop i's step as its window has free now, or wait until the oldest piece in flight comes free
        (a step that follows the one before gets what that one left free)."""
        sim = self.sim
        hop = self.hops[i]
        lp = sim.lp[hop]
        window = self.connections[i] * lp.window_bytes
        lane = self.lanes[i]
        win = lane.win
        if win is None:
            win = lane.win = SlidingWindow(window, lp.rtt_s)
        left = self.left[i]
        budget = win.budget(sim.now) if lp.rtt_s > 0 else float("inf")
        if budget <= left * 1e-12:
            sim.push(win.next_free_s(), self._piece, i)
            return
        part = min(left, budget)
        self.left[i] -= part
        if lp.rtt_s > 0:
            win.sent(sim.now, part)
        flow = Flow(part, float("inf"), self.prio, payload=(self, None, "ring", i, lp, sim.now, sim.links[hop]),
                    window=window)
        sim.links[hop].add(flow, sim.now)

    def part_done(self, i: int) -> None:
        """Hop i's piece has left: the next goes as its window comes free; the step's last one arrives a latency
        later, which lets the next DC (and this hop) go on."""
        sim = self.sim
        lane = self.lanes[i]
        if lane.win is not None:
            lane.win.ended(sim.now)
        if self.left[i] > 1e-9 * self.nbytes:
            self._piece(i)
            return
        self.busy[i] = False
        lane.owner = None
        if lane.queue:  # the step that waited longest for these connections goes next
            ring, j = lane.queue.popleft()
            ring._try_step(j)
        self.sent[i] += 1
        self.arrived[i].append(sim.now + sim.lp[self.hops[i]].latency_s)
        D = len(self.hops)
        if self.sent[i] == self.steps and self.on_arrive is not None:
            self.on_arrive((i + 1) % D, self.arrived[i][-1])
        if all(n == self.steps for n in self.sent):
            self.on_end([self.arrived[j - 1][-1] for j in range(D)])
            return
        self._try_step(i)
        self._try_step((i + 1) % D)

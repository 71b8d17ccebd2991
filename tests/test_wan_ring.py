"""The ring across DCs step by step (testbed/sim/wan_ring.py), on real links (sim/network.py LinkState) driven by
a minimal event loop: a window-bound step waits for its window to come free a round trip after it left, a
rate-bound step costs its bytes at the link's rate and a latency, the ring slows with latency, and a DC entering
late finds its predecessor's first step already there. dp-wan's bucketed reduce-scatter across the WAN runs on it
(sim/collectives.py), DiLoCo's outer sync too (sim/sync.py), each DC entering as its members join."""

from __future__ import annotations

import heapq
import itertools

import pytest

from testbed.plan.plan import LinkPlan
from testbed.sim.network import Flow, LinkState
from testbed.sim.wan_ring import Lane, WanRing

C = 1e8  # bytes/s


class Loop:
    """The executor's part a ring uses: push, now, lp, links, and a flow's end handed back to its ring."""

    def __init__(self, latency_s: float | tuple[float, ...], window_bytes: float, dcs: tuple[str, ...] = ("a", "b")
                 ) -> None:
        self.now = 0.0
        self.heap: list = []
        self.seq = itertools.count()
        hops = list(zip(dcs, dcs[1:] + dcs[:1], strict=True))
        lats = latency_s if isinstance(latency_s, tuple) else (latency_s,) * len(hops)  # per hop, DC i's to the next
        self.lp = {h: LinkPlan(*h, C, lat, window_bytes, 1, False) for h, lat in zip(hops, lats, strict=True)}
        self.links = {h: LinkState(C, False, self._flow_end) for h in hops}
        self.hops = hops
        self.pieces: list[tuple] = []  # (ring, hop index, start, end) of every piece that left

    def push(self, t: float, fn, *args) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), fn, args))

    def _flow_end(self, t: float, flow: Flow, version: int) -> None:
        self.push(t, self._done, flow, version)

    def _done(self, flow: Flow, version: int) -> None:
        if version != flow.version:
            return
        ring, _, _, i, _lp, t, link = flow.payload
        self.pieces.append((ring, i, t, self.now))
        link.remove(flow, self.now)
        ring.part_done(i)

    def ring(self, nbytes: float, entries: tuple[float | None, ...] | None = None) -> list[float]:
        """Each DC's end of one ring of `nbytes` (1/D of it per step), every DC entering at 0 or DC i at
        `entries[i]` (None: never), once it has ended ([] if it never does)."""
        ends: list[float] = []
        self.last = WanRing(self, self.hops, (1,) * len(self.hops), nbytes, (0,), ends.extend)
        if entries is None:
            self.last.start(0.0)
        for i, t in enumerate(entries or ()):
            if t is not None:
                self.last.start_dc(i, t)
        while self.heap and not ends:
            t, _, fn, args = heapq.heappop(self.heap)
            self.now = t
            fn(*args)
        return ends


def test_a_step_of_one_window_costs_a_round_trip_and_its_bytes_at_the_links_rate():
    """Two DCs, two steps of one window each: the first arrives w/C + latency after it starts; the second may
    leave only when the first's window comes back, a round trip after it left."""
    lat, w = 0.02, 2e5  # w / C = 2 ms, well under a round trip
    ends = Loop(lat, w).ring(2 * w)
    assert ends == pytest.approx([2 * lat + w / C + lat] * 2, rel=1e-9)


def test_a_window_bound_step_takes_whole_round_trips_for_its_full_windows():
    """3.5 windows per step: three round trips for the full windows, the last half window at the link's rate,
    then a latency (not 3.5 round trips, as a fluid flow at W / RTT would charge)."""
    lat, w = 0.02, 2e5
    x = 3.5 * w
    ends = Loop(lat, w, ("a", "b", "c")).ring(3 * x)  # D = 3: four steps, each after the one before arrived
    first = 3 * 2 * lat + 0.5 * w / C + lat
    assert min(ends) > 4 * first - 1e-9  # a step waits for the one it receives
    fluid = 4 * (x / (w / (2 * lat)) + lat)
    assert max(ends) < fluid


def test_a_rate_bound_step_costs_its_bytes_at_the_links_rate_and_a_latency():
    lat = 0.01
    w = 10 * C * 2 * lat  # ten bandwidth-delay products: never window-bound
    x = 4e6
    ends = Loop(lat, w).ring(2 * x)
    assert ends == pytest.approx([2 * (x / C + lat)] * 2, rel=1e-9)


@pytest.mark.parametrize("windows", [0.5, 1.0, 2.3, 7.0])
def test_a_ring_slows_with_latency(windows):
    w = 2e5
    times = [max(Loop(lat, w).ring(2 * windows * w)) for lat in (0.001, 0.005, 0.02, 0.05)]
    assert all(a < b for a, b in zip(times, times[1:], strict=False))


def test_a_ring_shares_its_link_with_other_traffic():
    """A flow already on the link takes half of it: a rate-bound ring then takes about twice as long on the wire."""
    lat = 0.01
    w = 10 * C * 2 * lat
    x = 4e6
    alone = max(Loop(lat, w).ring(2 * x))
    loop = Loop(lat, w)
    for h in loop.hops:
        loop.links[h].add(Flow(1e12, float("inf"), (0,)), 0.0)  # outlives the ring; never completes in the test
    shared = max(loop.ring(2 * x))
    assert shared == pytest.approx(2 * (2 * x / C + lat), rel=1e-9) and shared > 1.9 * alone - 2 * lat


def test_a_dc_entering_late_finds_its_predecessors_first_step_there():
    """Rate-bound, two DCs: a enters at 0, b at T (after a's first step arrived). b's second step goes as soon as
    its first has left, so a ends a latency before a ring both DCs entered at T (b's end is that ring's)."""
    lat = 0.01
    w = 10 * C * 2 * lat
    x = 4e6
    T = 0.5
    ends = Loop(lat, w).ring(2 * x, (0.0, T))
    assert ends == pytest.approx([T + 2 * x / C + lat, T + 2 * (x / C + lat)], rel=1e-9)
    both_late = Loop(lat, w).ring(2 * x, (T, T))
    assert both_late == pytest.approx([T + 2 * (x / C + lat)] * 2, rel=1e-9)


def test_a_dc_that_never_enters_sends_nothing_and_the_ring_waits_for_it():
    loop = Loop(0.01, 2e5, ("a", "b", "c"))
    assert loop.ring(3e6, (0.0, 0.0, None)) == []
    assert loop.last.sent[2] == 0 and loop.last.sent[0] == 1  # a's second step waits for c's first


def test_a_dc_is_done_when_its_last_step_arrives_while_its_own_last_step_still_waits_to_leave():
    """Two DCs, a step of one window each, a's hop to b slow (La) and b's back fast (Lb): a's second step may leave
    only when its first step's window comes free, a round trip of its hop after it left (2 La), but a is done once
    b's second step has arrived (b's window came free after 2 Lb, b had a's first step at w/C + La): its own last
    step leaves from its send buffer afterwards. b is done when that step arrives."""
    La, Lb, w = 0.05, 0.005, 2e5
    ends = Loop((La, Lb), w).ring(2 * w)
    assert ends == pytest.approx([2 * w / C + La + Lb, 2 * La + w / C + La], rel=1e-9)
    assert ends[0] < 2 * La  # before a's own last step could leave


@pytest.mark.parametrize("shared", [True, False])
def test_rings_of_one_communicator_take_its_connections_in_turn(shared):
    """Two rings entered at once (as a stage's fragment enters behind the last step the fragment before left in the
    send buffers), rate-bound steps of x: sharing their connections (one Lane per hop), no piece of one is on a hop
    while a piece of the other is, the steps leave in the order they were ready (ring 1's first before ring 0's
    second: 3 x / C + a latency, then 4 x / C + a latency); on connections of their own they share the rate."""
    lat, w = 0.01, 10 * C * 2 * 0.01
    x = 4e6
    alone = Loop(lat, w).ring(2 * x)
    loop = Loop(lat, w)
    lanes: dict[tuple[str, str], Lane] | None = {} if shared else None
    ends: list[list[float]] = [[], []]
    for k in (0, 1):
        WanRing(loop, loop.hops, (1, 1), 2 * x, (0,), ends[k].extend, None, lanes).start(0.0)
    while loop.heap and not all(ends):
        t, _, fn, args = heapq.heappop(loop.heap)
        loop.now = t
        fn(*args)
    overlap = any(a[0] is not b[0] and a[1] == b[1] and a[2] < b[3] - 1e-12 and b[2] < a[3] - 1e-12
                  for a in loop.pieces for b in loop.pieces)
    assert overlap != shared
    if shared:
        assert ends == [pytest.approx([3 * x / C + lat] * 2, rel=1e-9), pytest.approx([4 * x / C + lat] * 2, rel=1e-9)]
    assert min(ends[0]) > max(alone)  # either way the second ring slows the first

"""The simulator's bucketed collectives (testbed/program.py ReduceScatter, AllGather; plan/buckets.py): a
collective starts once every member has issued it and the one before it on its stream is done, one at a time
per stream as on one NCCL communicator (a stage's reduce-scatters across its replicas; a stage's all-gathers
inside one DC). Inside a DC one costs what a ring's share of the all-reduce costs there (no contention, as a
pipe inside a DC); a hierarchical reduce-scatter then carries each DC's shards around the ring of DCs as one
flow per WAN hop, over the connections NCCL opens (as the all-reduce of `Simulation.stage_finished`), and each
of its 2(D - 1) ring steps arrives a latency after it leaves, its first window at the link's rate
(`step_correction_s`). At its end every member's Await on it may go on.
"""

from __future__ import annotations

from collections import defaultdict, deque

from testbed.plan.plan import LinkPlan
from testbed.program import AllGather, ReduceScatter, await_slot
from testbed.sim.network import Flow
from testbed.timeline import group_name

KIND = {"ReduceScatter": "reduce_scatter", "AllGather": "all_gather"}  # the timeline's interval kinds


def step_correction_s(step_bytes: float, window_bytes: float, lp: LinkPlan) -> float:
    """What one ring step across a WAN hop takes beyond its bytes as a fluid flow at the hop's rate r = min(C,
    n W / RTT): it arrives one latency after its last byte leaves, and its first window leaves at the link's
    rate, as a pipe's does (sim/executor.py SlidingWindow): (x - w)+ / r + min(x, w) / C + latency, less x / r.
    Negative for window-bound steps of a window or more: the fluid flow charged a round trip for the first."""
    if lp.rtt_s <= 0:
        return lp.latency_s
    rate = min(lp.capacity_bytes_s, window_bytes / lp.rtt_s)
    x, w = step_bytes, window_bytes
    return max(0.0, x - w) / rate + min(x, w) / lp.capacity_bytes_s + lp.latency_s - x / rate


class Collectives:
    def __init__(self, sim) -> None:
        self.sim = sim
        self.issued: dict[tuple, int] = defaultdict(int)  # collective -> replicas that issued it
        self.queue: dict[tuple, deque] = defaultdict(deque)  # stream -> collectives ready, in order
        self.running: set[tuple] = set()  # streams with a collective under way
        self.wan_left: dict[tuple, int] = {}  # stream -> WAN hops its reduce-scatter still has on the links

    def _where(self, g: int, st: ReduceScatter | AllGather) -> tuple[tuple, tuple, tuple[str, ...]]:
        """(collective, stream, members) of group g's step."""
        s = g % self.sim.p.pp
        if isinstance(st, ReduceScatter):
            members = tuple(x for ring in st.rings for x in ring)
            return ("ReduceScatter", s, st.bucket), ("rs", s), members
        name = group_name(s, self.sim.replica(g))
        ring = next(ring for ring in st.rings if name in ring)
        return ("AllGather", s, ring[0], st.bucket), ("ag", s, ring[0]), ring

    def issue(self, g: int, st: ReduceScatter | AllGather) -> None:
        """Group g issues a collective (for the replicas it stands for)."""
        sim = self.sim
        key, stream, members = self._where(g, st)
        self.issued[key] += sim.weight[g // sim.p.pp]
        if self.issued[key] == len(members):
            self.queue[stream].append((st, members))
            if stream not in self.running:
                self._start(stream)

    def _start(self, stream: tuple) -> None:
        sim, p = self.sim, self.sim.p
        st, members = self.queue[stream].popleft()
        self.running.add(stream)
        by_dc: dict[str, int] = defaultdict(int)
        for name in members:
            s, r = (int(x) for x in name[1:].split("r"))
            by_dc[p.stage_dc[r][s]] += 1
        B = st.bytes
        if isinstance(st, AllGather) or st.algorithm == "ring":
            n = len(members)
            bw = min(p.intra[d].bandwidth_bytes_s for d in by_dc)
            lat = max(p.intra[d].latency_s for d in by_dc)
            dur = (n - 1) / n * B / bw + (n - 1) * lat if n > 1 else 0.0
            sim.push(sim.now + dur, self._end, stream, st, members, sim.now)
            return
        local = max((n - 1) / n * B / p.intra[d].bandwidth_bytes_s for d, n in by_dc.items())
        sim.push(sim.now + local, self._across, stream, st, members, sim.now, list(by_dc))

    def _across(self, stream: tuple, st: ReduceScatter, members: tuple, t0: float, dcs: list[str]) -> None:
        """Each DC's shards around the ring of DCs: 2(D-1)/D of the bucket on every hop, as one flow each."""
        sim = self.sim
        ring = [d for d in sim.p.gpu_types if d in dcs]  # topology order
        D = len(ring)
        hops = list(zip(ring, ring[1:] + ring[:1], strict=True))
        conns = {a: st.wan_connections[ring.index(a)] for a in ring}
        tail = 2 * (D - 1) * max(step_correction_s(st.bytes / D, conns[a] * sim.lp[(a, b)].window_bytes,
                                                   sim.lp[(a, b)]) for a, b in hops)
        self.wan_left[stream] = len(hops)
        for a, b in hops:
            lp = sim.lp[(a, b)]
            cap = conns[a] * lp.window_bytes / lp.rtt_s if lp.rtt_s > 0 else float("inf")
            done = (self._wan_hop_done, stream, st, members, t0, tail)
            flow = Flow(2 * (D - 1) / D * st.bytes, cap, (float("inf"), stream[1]),
                        payload=(done, None, "rs", -1, lp, sim.now, sim.links[(a, b)]),
                        window=conns[a] * lp.window_bytes)
            sim.links[(a, b)].add(flow, sim.now)

    def _wan_hop_done(self, stream: tuple, st: ReduceScatter, members: tuple, t0: float, tail: float) -> None:
        self.wan_left[stream] -= 1
        if not self.wan_left[stream]:
            self.sim.push(self.sim.now + max(0.0, tail), self._end, stream, st, members, t0)

    def _end(self, stream: tuple, st: ReduceScatter | AllGather, members: tuple, t0: float) -> None:
        """The collective is done: its members' intervals, their Awaits free, the stream's next one started."""
        sim, p = self.sim, self.sim.p
        op = type(st).__name__
        idx = 2 * p.microbatches + await_slot(op, st.bucket)
        names = set(members)
        woken = []
        for k, r in enumerate(sim.reps):
            g = k * p.pp + stream[1]
            if group_name(stream[1], r) not in names:
                continue
            sim.out.append((g, KIND[op], st.bucket, t0, sim.now, st.bytes))
            sim.arrival[g][idx] = sim.now
            if sim.waits[g] == idx:
                sim.waits[g] = -1
                woken.append(g)
        self.running.discard(stream)
        if self.queue[stream]:
            self._start(stream)
        sim.wake(woken)

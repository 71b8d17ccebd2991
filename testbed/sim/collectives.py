"""The simulator's bucketed collectives (testbed/program.py ReduceScatter, AllGather; plan/buckets.py): a
collective starts once every member has issued it and the one before it on its stream is done, one at a time
per stream as on one NCCL communicator (a stage's reduce-scatters across its replicas; a stage's all-gathers
inside one DC). Inside a DC one costs what a ring's share of the all-reduce costs there (no contention, as a
pipe inside a DC); a hierarchical reduce-scatter then carries each DC's shards around the ring of DCs over the
connections NCCL opens, step by step as DiLoCo's outer sync does (sim/wan_ring.py: each of its 2(D - 1) steps
once the step before has arrived, a window at a time, each step arriving a latency after it leaves). At its
end every member's Await on it may go on.
"""

from __future__ import annotations

from collections import defaultdict, deque

from testbed.program import AllGather, ReduceScatter, await_slot
from testbed.sim.wan_ring import WanRing
from testbed.timeline import group_name

KIND = {"ReduceScatter": "reduce_scatter", "AllGather": "all_gather"}  # the timeline's interval kinds


class Collectives:
    def __init__(self, sim) -> None:
        self.sim = sim
        self.issued: dict[tuple, int] = defaultdict(int)  # collective -> replicas that issued it
        self.queue: dict[tuple, deque] = defaultdict(deque)  # stream -> collectives ready, in order
        self.running: set[tuple] = set()  # streams with a collective under way

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
        """Each DC's shards around the ring of DCs, step by step (sim/wan_ring.py); the collective ends with the
        last DC's last step."""
        sim = self.sim
        ring = [d for d in sim.p.gpu_types if d in dcs]  # topology order
        hops = list(zip(ring, ring[1:] + ring[:1], strict=True))
        WanRing(sim, hops, st.wan_connections, st.bytes, (float("inf"), stream[1]),
                lambda ends: self._end(stream, st, members, t0, max(ends))).start(sim.now)

    def _end(self, stream: tuple, st: ReduceScatter | AllGather, members: tuple, t0: float,
             t1: float | None = None) -> None:
        """The collective is done (now, or at t1 if later): its members' intervals, their Awaits free, the stream's
        next one started."""
        sim, p = self.sim, self.sim.p
        if t1 is not None and t1 > sim.now:
            sim.push(t1, self._end, stream, st, members, t0)
            return
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

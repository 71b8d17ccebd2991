"""The simulator's blocking collectives of a sync period's program (testbed/plan/diloco.py): the inner
all-reduce among a DC's replicas and each fragment's OuterSync across DCs.

A group reaching one JOINs it and goes on (to the RECV that waits for its end, or, after an OuterSync, to the
inner steps it overlaps). Once every member has joined (symmetric replicas counted by their weight), the
collective runs and each member's flag is set at its end:

- inner all-reduce: a ring among the DC's n replicas on the DC fabric, 2 (n - 1) / n x bytes at the fabric's
  bandwidth plus 2 (n - 1) latencies, as the synchronous ring is costed (executor.stage_finished);
- OuterSync: hierarchical: a reduce-scatter inside each DC, a ring across the DCs in 2 (D - 1) steps of 1/D of
  the bytes per WAN hop (sim/wan_ring.py: a DC sends its step once the one before it has arrived; a window at a
  time, each a flow sharing the link with anything else on it, the next a round trip after the one before
  started), and an all-gather inside each DC; each DC's groups go on when their own part is done.
"""

from __future__ import annotations

from testbed.program import AllReduce, OuterSync
from testbed.sim.wan_ring import WanRing
from testbed.timeline import group_name


class SyncCollectives:
    """Mixed into the Simulation (sim/executor.py), whose state it uses: p, reps, weight, now, links, lp, out."""

    def init_collectives(self) -> None:
        self.joined: dict[tuple, list] = {}  # collective -> [members' weight so far, [(group, flag)]]
        self.outer: dict[tuple, dict] = {}  # OuterSync in flight -> its state
        self.group_dc: dict[str, str] = {}  # group name -> its DC (filled at the first JOIN)

    def join(self, g: int, st: AllReduce | OuterSync, slot: int, key: tuple) -> None:
        """Group g joins collective `st` (`key`: which of the period's); its end sets g's flag `slot`."""
        if not self.group_dc:
            self.group_dc.update({group_name(s, r): self.p.stage_dc[r][s] for r in range(self.p.dp)
                                  for s in range(self.p.pp)})
        k = (key, st.rings)
        entry = self.joined.setdefault(k, [0, []])
        entry[0] += self.weight[g // self.p.pp]
        entry[1].append((g, slot))
        if entry[0] < sum(map(len, st.rings)):
            return
        del self.joined[k]
        if key[0] == "ar":
            self._inner_ring(st, entry[1])
        else:
            self._outer_start(k, st, entry[1])

    def _ring_s(self, dc: str, n: int, nbytes: float) -> float:
        intra = self.p.intra[dc]
        return 2 * (n - 1) / n * nbytes / intra.bandwidth_bytes_s + 2 * (n - 1) * intra.latency_s if n > 1 else 0.0

    def _finish(self, members: list, kind: str, mb: int, t0: float, t1: float, nbytes: float) -> None:
        for g, _slot in members:
            self.out.append((g, kind, mb, t0, t1, nbytes))
        for g, slot in members:
            self._deliver(g, slot, t1)

    def _inner_ring(self, st: AllReduce, members: list) -> None:
        ring = st.rings[0]
        end = self.now + self._ring_s(self.group_dc[ring[0]], len(ring), st.bytes)
        self._finish(members, "allreduce", -1, self.now, end, st.bytes)

    def _outer_start(self, k: tuple, st: OuterSync, members: list) -> None:
        """Reduce-scatter inside each DC, then the ring across DCs (WAN flows), then all-gather inside."""
        dcs = [self.group_dc[r[0]] for r in st.rings]
        local = max(self._ring_s(d, len(r), st.bytes) - 2 * (len(r) - 1) * self.p.intra[d].latency_s
                    for d, r in zip(dcs, st.rings, strict=True))
        D = len(dcs)
        state = {"t0": self.now, "members": members, "st": st, "pending": 0}
        self.outer[k] = state
        if self.p.ideal_wan or D < 2:  # the lower-bound run: the ring across DCs on the DC fabric
            across = max(self._ring_s(d, D, st.bytes) for d in dcs)
            self._finish(members, "outersync", st.fragment, self.now, self.now + local + across, st.bytes)
            del self.outer[k]
            return
        hops = list(zip(dcs, dcs[1:] + dcs[:1], strict=True))
        state.update(dcs=dcs, tail=local / 2)
        WanRing(self, hops, st.wan_connections, st.bytes, (float("inf"), st.fragment),
                lambda ends: self._outer_end(k, ends)).start(self.now + local / 2)

    def _outer_end(self, k: tuple, ends: list[float]) -> None:
        """Every DC's groups are done when their last step has arrived and left (then the all-gather inside)."""
        state = self.outer.pop(k)
        st: OuterSync = state["st"]
        end = {d: t + state["tail"] for d, t in zip(state["dcs"], ends, strict=True)}
        P = self.p.pp
        for g, slot in state["members"]:
            t1 = end[self.p.stage_dc[self.reps[g // P]][g % P]]
            self.out.append((g, "outersync", st.fragment, state["t0"], t1, st.bytes))
            self._deliver(g, slot, t1)

"""The simulator's blocking collectives of a sync period's program (testbed/plan/diloco.py): the inner
all-reduce among a DC's replicas and each fragment's OuterSync across DCs.

A group reaching one JOINs it and goes on (to the RECV that waits for its end, or, after an OuterSync, to the
inner steps it overlaps); each member's flag is set at its end (symmetric replicas counted by their weight):

- inner all-reduce: once every member has joined, a ring among the DC's n replicas on the DC fabric,
  2 (n - 1) / n x bytes at the fabric's bandwidth plus 2 (n - 1) latencies, as the synchronous ring is costed
  (executor.stage_finished);
- OuterSync: hierarchical, each DC on its own: once the DC's own members have joined, a reduce-scatter inside it,
  then its part of a ring across the DCs in 2 (D - 1) steps of 1/D of the bytes per WAN hop (sim/wan_ring.py: a
  DC's first step leaves as it enters, each later one once the DC before it has sent it the step before; a window
  at a time, each a flow sharing the link with anything else on it, the next a round trip after the one before
  started), and an all-gather inside the DC; each DC's groups go on when their own part is done: when the DC
  before it has sent it the last step (its own last step leaves from its send buffers meanwhile, and the next
  fragment's steps on those connections wait behind it: the stage's syncs share one `Lane` per hop). DCs reach a
  fragment's sync apart (each DC's sync of the fragment before ended at its own time), and what a DC sends
  before the last one joins is time the ring saves, as the emulated workers' exchanges (runtime/worker.py
  OuterSyncThread) and NCCL's ring, whose ranks send their first chunk as each launches the collective.
"""

from __future__ import annotations

from testbed.program import AllReduce, OuterSync
from testbed.sim.wan_ring import WanRing
from testbed.timeline import group_name


class SyncCollectives:
    """Mixed into the Simulation (sim/executor.py), whose state it uses: p, reps, weight, now, links, lp, out."""

    def init_collectives(self) -> None:
        self.joined: dict[tuple, list] = {}  # inner all-reduce -> [members' weight so far, [(group, flag)]]
        self.outer: dict[tuple, dict] = {}  # OuterSync in flight -> its state (_outer_state)
        self.group_dc: dict[str, str] = {}  # group name -> its DC (filled at the first JOIN)
        self.lanes: dict[tuple, dict] = {}  # a stage's rings -> its connections across DCs (wan_ring.Lane) by hop

    def join(self, g: int, st: AllReduce | OuterSync, slot: int, key: tuple) -> None:
        """Group g joins collective `st` (`key`: which of the period's); its end sets g's flag `slot`."""
        if not self.group_dc:
            self.group_dc.update({group_name(s, r): self.p.stage_dc[r][s] for r in range(self.p.dp)
                                  for s in range(self.p.pp)})
        k = (key, st.rings)
        if key[0] == "os" and not self.p.ideal_wan and len(st.rings) > 1:
            self._outer_join(k, st, g, slot)
            return
        entry = self.joined.setdefault(k, [0, []])
        entry[0] += self.weight[g // self.p.pp]
        entry[1].append((g, slot))
        if entry[0] < sum(map(len, st.rings)):
            return
        del self.joined[k]
        if key[0] == "ar":
            self._inner_ring(st, entry[1])
        else:
            self._outer_lower_bound(st, entry[1])

    def _ring_s(self, dc: str, n: int, nbytes: float) -> float:
        intra = self.p.intra[dc]
        return 2 * (n - 1) / n * nbytes / intra.bandwidth_bytes_s + 2 * (n - 1) * intra.latency_s if n > 1 else 0.0

    def _local_s(self, dc: str, n: int, nbytes: float) -> float:
        """An OuterSync's reduce-scatter and all-gather inside DC `dc` of n members together (bandwidth only)."""
        return self._ring_s(dc, n, nbytes) - 2 * (n - 1) * self.p.intra[dc].latency_s

    def _finish(self, members: list, kind: str, mb: int, t0: float, t1: float, nbytes: float) -> None:
        for g, _slot in members:
            self.out.append((g, kind, mb, t0, t1, nbytes))
        for g, slot in members:
            self._deliver(g, slot, t1)

    def _inner_ring(self, st: AllReduce, members: list) -> None:
        ring = st.rings[0]
        end = self.now + self._ring_s(self.group_dc[ring[0]], len(ring), st.bytes)
        self._finish(members, "allreduce", -1, self.now, end, st.bytes)

    def _outer_lower_bound(self, st: OuterSync, members: list) -> None:
        """The lower-bound run (`ideal_wan`) or one DC: the ring across DCs on the DC fabric, once all have joined."""
        dcs = [self.group_dc[r[0]] for r in st.rings]
        local = max(self._local_s(d, len(r), st.bytes) for d, r in zip(dcs, st.rings, strict=True))
        across = max(self._ring_s(d, len(dcs), st.bytes) for d in dcs)
        self._finish(members, "outersync", st.fragment, self.now, self.now + local + across, st.bytes)

    def _outer_state(self, k: tuple, st: OuterSync) -> dict:
        """A new OuterSync's state: its ring across DCs, each DC's members (with when they joined) and weight joined
        so far, and its local half (reduce-scatter or all-gather inside it)."""
        dcs = [self.group_dc[r[0]] for r in st.rings]
        hops = list(zip(dcs, dcs[1:] + dcs[:1], strict=True))
        ring = WanRing(self, hops, st.wan_connections, st.bytes, (float("inf"), st.fragment), lambda ends: None,
                       lambda i, t: self.push(t + state["half"][i], self._outer_dc_end, k, i),
                       self.lanes.setdefault(st.rings, {}))
        state = {"st": st, "ring": ring, "members": [[] for _ in dcs], "weight": [0] * len(dcs), "left": len(dcs),
                 "index": {name: i for i, r in enumerate(st.rings) for name in r},
                 "half": [self._local_s(d, len(r), st.bytes) / 2 for d, r in zip(dcs, st.rings, strict=True)]}
        return state

    def _outer_join(self, k: tuple, st: OuterSync, g: int, slot: int) -> None:
        """Group g joins an OuterSync across DCs: once its DC's members all have, the DC reduce-scatters inside
        and enters the ring across DCs."""
        state = self.outer.get(k)
        if state is None:
            state = self.outer[k] = self._outer_state(k, st)
        P = self.p.pp
        i = state["index"][group_name(g % P, self.reps[g // P])]
        state["members"][i].append((g, slot, self.now))
        state["weight"][i] += self.weight[g // P]
        if state["weight"][i] == len(st.rings[i]):
            state["ring"].start_dc(i, self.now + state["half"][i])

    def _outer_dc_end(self, k: tuple, i: int) -> None:
        """DC i's part is done (its last step across DCs arrived, then the all-gather inside): its groups go on;
        each group's interval starts where it joined."""
        state = self.outer[k]
        st: OuterSync = state["st"]
        for g, slot, t0 in state["members"][i]:
            self.out.append((g, "outersync", st.fragment, t0, self.now, st.bytes))
            self._deliver(g, slot, self.now)
        state["left"] -= 1
        if not state["left"]:
            del self.outer[k]

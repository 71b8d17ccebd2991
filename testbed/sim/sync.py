"""The simulator's blocking collectives of a sync period's program (testbed/plan/diloco.py): the inner
all-reduce among a DC's replicas and each fragment's OuterSync across DCs.

A group reaching one JOINs it and goes on (to the RECV that waits for its end, or, after an OuterSync, to the
inner steps it overlaps). Once every member has joined (symmetric replicas counted by their weight), the
collective runs and each member's flag is set at its end:

- inner all-reduce: a ring among the DC's n replicas on the DC fabric, 2 (n - 1) / n x bytes at the fabric's
  bandwidth plus 2 (n - 1) latencies, as the synchronous ring is costed (executor.stage_finished);
- OuterSync: hierarchical: a reduce-scatter inside each DC, a ring across the DCs in 2 (D - 1) steps of 1/D of
  the bytes per WAN hop (`_try_step`: a DC sends its step once the one before it has arrived; a window at a time,
  each a flow sharing the link with anything else on it, the next a round trip after the one before started),
  and an all-gather inside each DC; each DC's groups go on when their own part is done.
"""

from __future__ import annotations

from testbed.program import AllReduce, OuterSync
from testbed.sim.network import Flow, SlidingWindow
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
        state.update(hops=hops, dcs=dcs, steps=2 * (D - 1), tail=local / 2, left=[0.0] * D, busy=[False] * D,
                     sent=[0] * D, sent_end=[self.now] * D, arrived=[[] for _ in range(D)], win=[None] * D)
        for h in range(D):
            self.push(self.now + local / 2, self._try_step, k, h)

    def _try_step(self, k: tuple, i: int) -> None:
        """Start hop i's next step of the ring across DCs if it may: DC i sends its step s (1/D of the bytes) to
        the next DC once its step s - 1 has left and step s - 1 of the DC before it has arrived (as each exchange
        waits for the one it receives, and a DC's sends leave in order on its connections). Its window (n x W, n:
        the DC's groups) goes out a piece at a time at whatever share of the link it gets, the next piece one round
        trip after the one before started (as a window-bound TCP sender's acknowledgements come back:
        executor.SlidingWindow)."""
        state = self.outer[k]
        s = state["sent"][i]
        if state["busy"][i] or s >= state["steps"]:
            return
        if s > 0:
            prev = state["arrived"][i - 1]  # the DC before: hop i - 1 ends at DC i
            if len(prev) < s:
                return  # hop i - 1's step s - 1 is not out yet; its end starts this one
            if prev[s - 1] > self.now:
                self.push(prev[s - 1], self._try_step, k, i)
                return
        state["busy"][i] = True
        state["left"][i] = state["st"].bytes / len(state["hops"])
        self._piece(k, i)

    def _piece(self, k: tuple, i: int) -> None:
        """As much of hop i's step as its window has free now, or wait until the oldest piece in flight comes free
        (the window slides across steps: a step that follows the one before gets what that one left free)."""
        state = self.outer[k]
        st: OuterSync = state["st"]
        hop = state["hops"][i]
        lp = self.lp[hop]
        window = st.wan_connections[i] * lp.window_bytes
        win = state["win"][i]
        if win is None:

            win = state["win"][i] = SlidingWindow(window, lp.rtt_s)
        left = state["left"][i]
        budget = win.budget(self.now) if lp.rtt_s > 0 else float("inf")
        if budget <= left * 1e-12:
            self.push(win.next_free_s(), self._piece, k, i)
            return
        part = min(left, budget)
        state["left"][i] -= part
        if lp.rtt_s > 0:
            win.sent(self.now, part)
        flow = Flow(part, float("inf"), (float("inf"), st.fragment),
                    payload=(k, None, "os", i, lp, self.now, self.links[hop]), window=window)
        self.links[hop].add(flow, self.now)

    def outer_part_done(self, k: tuple, i: int, lp, t_start: float) -> None:
        """Hop i's piece (started at t_start) has left: the next goes as its window comes free; the step's last
        one arrives a latency later, which lets the next DC (and this hop) go on."""
        state = self.outer[k]
        if state["win"][i] is not None:
            state["win"][i].ended(self.now)
        if state["left"][i] > 1e-9 * state["st"].bytes:
            self._piece(k, i)
            return
        state["busy"][i] = False
        state["sent"][i] += 1
        state["sent_end"][i] = self.now
        state["arrived"][i].append(self.now + lp.latency_s)
        D = len(state["hops"])
        if all(n == state["steps"] for n in state["sent"]):
            self._outer_end(k)
            return
        self._try_step(k, i)
        self._try_step(k, (i + 1) % D)

    def _outer_end(self, k: tuple) -> None:
        """Every DC's groups are done when their last step has arrived and left (then the all-gather inside)."""
        state = self.outer.pop(k)
        st: OuterSync = state["st"]
        D = len(state["dcs"])
        end = {state["dcs"][j]: max(state["arrived"][j - 1][-1], state["sent_end"][j]) + state["tail"]
               for j in range(D)}
        P = self.p.pp
        for g, slot in state["members"]:
            t1 = end[self.p.stage_dc[self.reps[g // P]][g % P]]
            self.out.append((g, "outersync", st.fragment, state["t0"], t1, st.bytes))
            self._deliver(g, slot, t1)

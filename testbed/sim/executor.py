"""Discrete-event execution of a Plan's lowered programs (plan/lower.py) into a Timeline.

Each (replica, stage) group runs its program in order: a Recv waits for its message, Forward and
Backward occupy the group for their time, a Send queues its message and goes on, and the AllReduce
joins the stage's replicas (the emulated workers execute the same programs). The transfers between two groups in one
direction travel on one set of TCP connections, a FIFO pipe: each transfer starts when the one before
it has left, and the set shares one n x W/RTT window cap (as NCCL send/recv on one communicator, or
our workers' striped sockets, queue successive messages). Inside a DC a pipe costs latency +
bytes/bandwidth with no contention between pipes; across DCs the pipe's head transfer is a flow on a
WAN link (see network.py) and arrives one propagation latency after its last byte leaves. After a stage's last
backward on every replica its gradients are all-reduced (ring inside the DC; hierarchical with a
ring across DCs for dp-wan). The iteration ends when every all-reduce is done.

Replicas that are provably symmetric (the same placement, costs and start time, on links shared side
by side) run identical timelines: one of each such class is simulated, standing for the others, and its
flows count once per replica in the link's sharing. Under temporal sharing replicas take turns, so
every replica is simulated.

A realised iteration (`Jitter`, BubbleTea's `PrefillJob`s) is what happens when the timing is not the
plan's: compute times and transfer delays draw from a seeded jitter distribution, and prefill jobs
placed against the predicted timeline occupy their group from their planned start. A job starts only
while its group is idle and never after its latest start (else it is skipped); when training needs the
group during a job, the job pauses at its next layer boundary and resumes at the group's next idle time,
as the emulated workers do (testbed/runtime/prefill.py). Training then waits at most one layer.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import defaultdict, deque
from dataclasses import dataclass

from testbed.plan.lower import lower
from testbed.plan.plan import Plan
from testbed.plan.turns import TURN_KEYS
from testbed.program import AllReduce, Forward, Recv, Send
from testbed.sim.linkchange import LiveLinks, WanSchedule
from testbed.sim.network import Flow, LinkState
from testbed.timeline import Timeline


@dataclass(frozen=True)
class Jitter:
    """Multiplicative timing noise, lognormal with mean 1: each compute op's time (`compute_cv`) and each
    transfer's delay (propagation on the WAN, the whole transfer inside a DC: `wan_cv`). Seeded."""

    seed: int
    compute_cv: float
    wan_cv: float


@dataclass(frozen=True)
class PrefillJob:
    """A prefill job on one group, times from the iteration's start."""

    start_s: float  # planned start
    duration_s: float
    latest_s: float  # never started later (its predicted bubble's end, less the guard and its duration)
    layers: int  # it may pause at a layer boundary
    key: tuple  # (request id, chunk)


def _lognormal(rng: random.Random, cv: float) -> float:
    if cv <= 0:
        return 1.0
    sigma = math.sqrt(math.log(1 + cv * cv))
    return rng.lognormvariate(-sigma * sigma / 2, sigma)


def replica_classes(plan: Plan) -> dict[int, list[int]]:
    """Replica -> the replicas it stands for (itself first). Symmetric replicas share one entry."""
    if any(lp.temporal for lp in plan.links.values()):
        return {r: [r] for r in range(plan.dp)}
    classes: dict[tuple, list[int]] = {}
    for r in range(plan.dp):
        key = (tuple(plan.stage_dc[r]), tuple(plan.fwd_s[r]), tuple(plan.bwd_s[r]), plan.replica_offset_s[r])
        classes.setdefault(key, []).append(r)
    return {rs[0]: rs for rs in classes.values()}


class Simulation:
    def __init__(self, plan: Plan, wan: WanSchedule | None = None, t0: float = 0.0, jitter: Jitter | None = None,
                 prefill: dict[str, list[PrefillJob]] | None = None) -> None:
        self.p = plan
        self.heap: list = []
        self.seq = 0
        self.now = 0.0
        realised = jitter is not None or bool(prefill)
        self.copies = {r: [r] for r in range(plan.dp)} if realised else replica_classes(plan)
        self.reps = list(self.copies)  # simulated replicas; group g = k * pp + s for replica reps[k]
        self.weight = [len(self.copies[r]) for r in self.reps]
        P, m = plan.pp, plan.microbatches
        n = P * len(self.reps)
        programs = lower(plan, self.reps)
        self.steps = [programs[f"s{s}r{r}"].steps for r in self.reps for s in range(P)]  # index g = k * pp + s
        self.index = {name: k * P + s for k, r in enumerate(self.reps) for s in range(P)
                      for name in (f"s{s}r{r}",)}
        self.ptr = [0] * n
        self.busy = [False] * n
        self.got_act = [bytearray(m) for _ in range(n)]
        self.got_grad = [bytearray(m) for _ in range(n)]
        self.stage_done = [0] * P
        self.out: list[tuple] = []  # (group, kind, microbatch, start, end, bytes)
        self.links = {
            k: LinkState(lp.capacity_bps, lp.temporal, self._schedule_flow) for k, lp in plan.links.items()
        }
        self.lp = dict(plan.links)  # each link as it is now (a changing WAN replaces entries)
        self.turn_pos = {r: i for i, r in enumerate(plan.turn_order)}
        self.turn_key = TURN_KEYS[plan.turn_policy]
        self.pipes: dict[tuple[int, int], deque] = defaultdict(deque)  # (src, dst) -> queued WAN transfers
        self.pipe_free: dict[tuple[int, int], float] = {}  # (src, dst) inside a DC -> when its last byte leaves
        self.wan_ar: dict[int, dict] = {}  # stage -> pending cross-DC all-reduce state
        self.events = 0
        self.wan = LiveLinks(self, wan, t0) if wan is not None else None  # the schedule's clock is t0 + now
        self.jitter = jitter
        self.rng = jitter is not None
        # noise as a function of what it applies to, not of the order events happen in: a realisation with
        # prefill and one without draw the same factors for the same op or transfer (a paired comparison)
        self.cfactor = [[_lognormal(random.Random(f"{jitter.seed}:c:{g}:{k}"), jitter.compute_cv)
                         for k in range(len(st))] if jitter else [] for g, st in enumerate(self.steps)]
        self.jobs: list[deque] = [deque(sorted((prefill or {}).get(name, []), key=lambda j: j.start_s))
                                  for name in sorted(self.index, key=self.index.get)]
        self.running: list[list | None] = [None] * n  # [job, segment start or None when paused, seconds left]
        self.pf_version = [0] * n
        self.ar_until = [0.0] * n  # the group's gradient all-reduce holds it until then
        self.prefill_done: list[tuple[tuple, str, float, float]] = []  # (key, group, first start, end)
        self.prefill_skipped: list[tuple[tuple, str, float]] = []

    def replica(self, g: int) -> int:
        return self.reps[g // self.p.pp]

    # --- event plumbing -------------------------------------------------------------------
    def push(self, t: float, fn, *args) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, fn, args))

    def _schedule_flow(self, t: float, flow: Flow, version: int) -> None:
        self.push(t, self._flow_done, flow, version)

    def run(self) -> Timeline:
        p = self.p
        for k, r in enumerate(self.reps):
            for s in range(p.pp):
                self.push(p.replica_offset_s[r], self.try_start, k * p.pp + s)
        if self.wan is not None:
            self.wan.start()
        for g, jobs in enumerate(self.jobs):
            for j in jobs:
                self.push(j.start_s, self._prefill_due, g)
        heap, pop = self.heap, heapq.heappop
        while heap:
            t, _, fn, args = pop(heap)
            self.now = t
            fn(*args)
            self.events += 1
        if any(self.ptr[g] < len(self.steps[g]) for g in range(len(self.ptr))):
            raise RuntimeError(f"{p.run_id}: simulation deadlocked (a schedule waits on input that never comes)")
        return Timeline.from_sim(p, self.out, self.reps, self.copies)

    # --- compute --------------------------------------------------------------------------
    def try_start(self, g: int) -> None:
        """Run g's program until it blocks: on a Recv whose message has not arrived, or on compute."""
        p = self.p
        if self.busy[g]:
            return
        s, r = g % p.pp, self.reps[g // p.pp]
        if self.now < p.replica_offset_s[r]:
            return
        steps = self.steps[g]
        k = self.ptr[g]
        while k < len(steps):
            st = steps[k]
            t = type(st)
            if t is Recv:
                if not (self.got_act if st.kind == "a" else self.got_grad)[g][st.microbatch]:
                    break
            elif t is Send:
                self.send(g, self.index[st.peer], st.kind, st.microbatch, st.bytes)
            elif t is AllReduce:
                self.ptr[g] = k + 1
                self.stage_finished(s, g, st)
            else:  # Forward or Backward
                self.ptr[g] = k
                self.busy[g] = True
                t0 = self._yield_prefill(g)
                secs = st.seconds * (self.cfactor[g][k] if self.rng else 1.0)
                self.push(t0 + secs, self.compute_done, g, st, t0)
                return
            k += 1
        self.ptr[g] = k
        if (self.jobs[g] or self.running[g]) and self._blocked(g):
            self._prefill_idle(g)

    def compute_done(self, g: int, st, t0: float) -> None:
        self.out.append((g, "fwd" if type(st) is Forward else "bwd", st.microbatch, t0, self.now, 0.0))
        self.busy[g] = False
        self.ptr[g] += 1
        self.try_start(g)

    # --- prefill in the bubbles (realised iterations) ------------------------------------------
    def _prefill_due(self, g: int) -> None:
        if not self.busy[g] and self._blocked(g):
            self._prefill_idle(g)

    def _blocked(self, g: int) -> bool:
        """g is idle: waiting for a message, or done with its program."""
        steps, k = self.steps[g], self.ptr[g]
        if self.now < self.ar_until[g] - 1e-12:
            return False
        return k >= len(steps) or type(steps[k]) is Recv or self.now < self.p.replica_offset_s[self.replica(g)]

    def _prefill_idle(self, g: int) -> None:
        """The group is idle: resume a paused job, else start the next due one (skipping late ones)."""
        run = self.running[g]
        if run is not None:
            if run[1] is None:
                run[1] = self.now
                self.pf_version[g] += 1
                self.push(self.now + run[2], self._prefill_end, g, self.pf_version[g])
            return
        jobs = self.jobs[g]
        while jobs and jobs[0].start_s <= self.now + 1e-12:
            j = jobs.popleft()
            if self.now > j.latest_s + 1e-12:
                self.prefill_skipped.append((j.key, self._name(g), self.now))
                continue
            self.running[g] = [j, self.now, j.duration_s, self.now]
            self.pf_version[g] += 1
            self.push(self.now + j.duration_s, self._prefill_end, g, self.pf_version[g])
            return

    def _prefill_end(self, g: int, version: int) -> None:
        if version != self.pf_version[g]:
            return
        j, t0, _left, first = self.running[g]
        self.out.append((g, "prefill", -1, t0, self.now, 0.0))
        self.prefill_done.append((j.key, self._name(g), first, self.now))
        self.running[g] = None
        self._prefill_idle(g)

    def _yield_prefill(self, g: int) -> float:
        """Training needs g now: a running job pauses at its next layer boundary; returns when g is free."""
        run = self.running[g]
        if run is None or run[1] is None:
            return self.now
        j, t0, left, first = run
        layer = j.duration_s / max(1, j.layers)
        t = min(t0 + left, t0 + math.ceil((self.now - t0) / layer - 1e-9) * layer)
        self.out.append((g, "prefill", -1, t0, t, 0.0))
        self.pf_version[g] += 1
        if t0 + left - t <= 1e-12:
            self.prefill_done.append((j.key, self._name(g), first, t))
            self.running[g] = None
        else:
            run[1], run[2] = None, t0 + left - t
        return t

    def _name(self, g: int) -> str:
        return f"s{g % self.p.pp}r{self.replica(g)}"

    def _delay(self, *what) -> float:
        if not self.rng:
            return 1.0
        return _lognormal(random.Random(f"{self.jitter.seed}:t:{what}"), self.jitter.wan_cv)

    # --- transfers ------------------------------------------------------------------------
    def send(self, src: int, dst: int, kind: str, i: int, nbytes: float) -> None:
        """Queue a transfer on the (src, dst) pipe; it leaves after the transfers queued before it."""
        p = self.p
        r = self.replica(src)
        a, b = p.stage_dc[r][src % p.pp], p.stage_dc[r][dst % p.pp]
        if a == b or p.ideal_wan:
            intra = p.intra[a]
            start = max(self.now, self.pipe_free.get((src, dst), 0.0))
            end = start + nbytes / intra.bandwidth_bps * self._delay(src, dst, kind, i)
            self.pipe_free[(src, dst)] = end
            arrive = end + intra.latency_s
            self.out.append((src, "send", i, self.now, end, nbytes))
            self.out.append((dst, "recv", i, self.now, arrive, nbytes))
            self.push(arrive, self.arrival, dst, kind, i)
            return
        pipe = self.pipes[(src, dst)]
        pipe.append((kind, i, nbytes, self.now))
        if len(pipe) == 1:
            self._start_head(src, dst, self.lp[(a, b)])

    def _start_head(self, src: int, dst: int, lp) -> None:
        kind, i, nbytes, t_issue = self.pipes[(src, dst)][0]
        k = src // self.p.pp
        prio = self.turn_key(i, self.turn_pos[self.reps[k]], kind, t_issue)
        flow = Flow(nbytes, lp.transfer_cap_bps, prio, payload=(src, dst, kind, i, lp, t_issue),
                    weight=self.weight[k], window=lp.connections * lp.window_bytes)
        self.links[(lp.src, lp.dst)].add(flow, self.now)

    def _flow_done(self, flow: Flow, version: int) -> None:
        if version != flow.version:
            return  # superseded by a rate change
        src, dst, kind, i, lp, t_issue = flow.payload
        self.links[(lp.src, lp.dst)].remove(flow, self.now)
        if kind == "ar":
            self._wan_allreduce_part_done(src)
            return
        arrive = self.now + self.lp[(lp.src, lp.dst)].latency_s * self._delay(src, dst, kind, i)
        self.out.append((src, "send", i, t_issue, self.now, flow.nbytes))
        self.out.append((dst, "recv", i, t_issue, arrive, flow.nbytes))
        self.push(arrive, self.arrival, dst, kind, i)
        pipe = self.pipes[(src, dst)]
        pipe.popleft()
        if pipe:
            self._start_head(src, dst, self.lp[(lp.src, lp.dst)])

    def arrival(self, g: int, kind: str, i: int) -> None:
        (self.got_act if kind == "a" else self.got_grad)[g][i] = 1
        self.try_start(g)

    # --- data-parallel gradient all-reduce ---------------------------------------------------
    def stage_finished(self, s: int, g: int, ar: AllReduce) -> None:
        self.stage_done[s] += self.weight[g // self.p.pp]
        if self.stage_done[s] < self.p.dp:
            return
        p = self.p
        by_dc: dict[str, list[int]] = defaultdict(list)
        for r in range(p.dp):
            by_dc[p.stage_dc[r][s]].append(r)
        G = ar.bytes
        if ar.algorithm == "ring":
            bw = min(p.intra[d].bandwidth_bps for d in by_dc)
            lat = max(p.intra[d].latency_s for d in by_dc)
            n = p.dp
            dur = 2 * (n - 1) / n * G / bw + 2 * (n - 1) * lat if n > 1 else 0.0
            self._allreduce_interval(s, self.now, self.now + dur)
            return
        # hierarchical: reduce-scatter in each DC, ring all-reduce across DCs, all-gather in each DC
        local = max(2 * (len(rs) - 1) / len(rs) * G / p.intra[d].bandwidth_bps for d, rs in by_dc.items())
        self.push(self.now + local / 2, self._start_wan_allreduce, s, self.now, local / 2, dict(by_dc), ar)

    def _start_wan_allreduce(self, s: int, t0: float, tail: float, by_dc: dict[str, list[int]], ar: AllReduce) -> None:
        p = self.p
        ring = [d for d in p.gpu_types if d in by_dc]  # topology order
        D = len(ring)
        nbytes = 2 * (D - 1) / D * ar.bytes
        hops = list(zip(ring, ring[1:] + ring[:1], strict=True))
        # each of the 2(D-1) ring steps pays one WAN latency; the bandwidth part is the flows below
        lat = max(self.lp[h].latency_s for h in hops)
        self.wan_ar[s] = {"pending": len(hops), "t0": t0, "tail": tail + 2 * (D - 1) * lat}
        for a, b in hops:
            lp = self.lp[(a, b)]
            conns = ar.wan_connections[ring.index(a)]
            cap = conns * lp.window_bytes / lp.rtt_s if lp.rtt_s > 0 else float("inf")
            flow = Flow(nbytes, cap, (float("inf"), s), payload=(s, None, "ar", -1, lp, self.now),
                        window=conns * lp.window_bytes)
            self.links[(a, b)].add(flow, self.now)

    def _wan_allreduce_part_done(self, s: int) -> None:
        st = self.wan_ar[s]
        st["pending"] -= 1
        if not st["pending"]:
            self._allreduce_interval(s, st["t0"], self.now + st["tail"])

    def _allreduce_interval(self, s: int, t0: float, t1: float) -> None:
        p = self.p
        if t1 <= t0:
            return
        for k in range(len(self.reps)):
            g = k * p.pp + s
            self.out.append((g, "allreduce", -1, t0, t1, p.grad_bytes[s]))
            if self.jobs[g] or self.running[g]:  # prefill gives way to the all-reduce, and waits for its end
                self._yield_prefill(g)
                self.ar_until[g] = t1
                self.push(t1, self._prefill_due, g)


def simulate(plan: Plan) -> tuple[Timeline, int]:
    """Run one iteration; returns its timeline and the number of events processed."""
    sim = Simulation(plan)
    tl = sim.run()
    return tl, sim.events


def simulate_changing(plan: Plan, wan: WanSchedule, t0: float) -> tuple[Timeline, Simulation]:
    """One iteration that starts at t0 on a changing WAN (testbed/sim/linkchange.py); the simulation keeps what
    it saw of the links (`sim.wan`)."""
    sim = Simulation(plan, wan, t0)
    return sim.run(), sim


def realise(plan: Plan, jitter: Jitter | None, prefill: dict[str, list[PrefillJob]] | None = None) -> Simulation:
    """One realised iteration (see the module docstring); the Simulation keeps what its prefill did."""
    sim = Simulation(plan, jitter=jitter, prefill=prefill)
    sim.timeline = sim.run()
    return sim

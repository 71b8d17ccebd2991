"""A realised iteration: what happens when the timing is not the plan's (BubbleTea's online planner runs
against these, testbed/bubbletea/realised.py).

Compute times and transfer delays draw from a seeded jitter distribution, and prefill jobs placed against
the predicted timeline occupy their group from their planned start. A job starts only while its group is
idle and never after its latest start (else it is skipped); when training needs the group during a job,
the job pauses at its next layer boundary and resumes at the group's next idle time, as the emulated
workers do (testbed/bubbletea/worker_side.py). Training then waits at most one layer.

A prefill job can take any idle moment of its group, so here every step of every group is an event at the
simulation's clock (the plan's iteration, testbed/sim/executor.py, runs groups ahead of the clock instead),
and events at one time go in the order they were pushed. The network, the pipes and the all-reduce are the
executor's.

A prefill job that carries a KV cache (`PrefillJob.kv`: its request's last chunk) ships it to the home DC
when it ends; from another DC that is a flow on the WAN link between the two, sharing the link with
training's transfers under the link's own rules. With spatial sharing the KV flows on a link are one class
(`Flow.group`): together they take one fair share, as one replica's pipe does, and split it among themselves;
under Atlas's temporal sharing it has the lowest priority (`KV_RANK`, after every replica's turn, idle
replicas included): it gets only what training's flows leave (between turns, or beside a window-bound
transfer), so training never waits for it, and the KV cache waits instead. Its cap is the link's
connections x window / RTT, as a training pipe's (so alone on a link it takes what `kv_transfer` in
testbed/bubbletea/run.py predicts). KV flows still on a link when the iteration ends are carried into the
next one with the bytes they have left (`kv_carry`, `stop_kv_at_s`).
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass

from testbed.errors import NotYetError
from testbed.plan.plan import Plan
from testbed.sim.executor import ALLREDUCE, INF, RECV, SEND, Simulation, paused_gc
from testbed.sim.network import Flow
from testbed.timeline import Timeline, group_name

# a KV flow's priority under temporal sharing: after every training flow, whose ranks are (turn key, replica)
# with IDLE_RANK = (inf,) the largest key (executor.py `rank`); KV flows among themselves: first come
KV_RANK = ((INF, INF),)


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
    kv: tuple[str, float] | None = None  # (home DC, bytes): the KV cache it ships when it ends (last chunk)


@dataclass(frozen=True)
class KvShipment:
    """A KV cache on its way to its home DC: what is left of it when an iteration begins (carried over)."""

    key: tuple  # its job's key
    src: str
    dst: str
    nbytes: float  # bytes left to send
    started_s: float  # when it left its group (this iteration's clock; negative: an earlier iteration's)


@dataclass(frozen=True)
class KvDone:
    """A KV cache shipped: its last byte left at `left_s`, it is in the home DC at `ready_s` (iteration clock)."""

    key: tuple
    src: str
    dst: str
    nbytes: float
    left_s: float
    ready_s: float


def _lognormal(rng: random.Random, cv: float) -> float:
    if cv <= 0:
        return 1.0
    sigma = math.sqrt(math.log(1 + cv * cv))
    return rng.lognormvariate(-sigma * sigma / 2, sigma)


class Realisation(Simulation):
    """One event per step; every replica simulated when there is noise or prefill (they break symmetry)."""

    event_order = None  # push order

    def __init__(self, plan: Plan, jitter: Jitter | None = None,
                 prefill: dict[str, list[PrefillJob]] | None = None, kv_carry: list[KvShipment] | None = None,
                 stop_kv_at_s: float | None = None) -> None:
        self.jitter = jitter
        self.rng = jitter is not None
        self.realised = jitter is not None or bool(prefill)  # else the plan's timing: symmetric replicas still are
        super().__init__(plan)
        if plan.dp > 1 and plan.mech.overlap:
            raise NotYetError(f"{plan.scheduler}: timing noise or BubbleTea's prefill with the overlap mechanism "
                              f"(bucketed collectives); use {plan.scheduler}-overlap")
        n = len(self.steps)
        self.busy = [False] * n
        self.offset = [plan.replica_offset_s[r] for r in self.reps for _ in range(plan.pp)]
        # noise as a function of what it applies to, not of the order events happen in: a realisation with
        # prefill and one without draw the same factors for the same op or transfer (a paired comparison)
        self.cfactor = [[_lognormal(random.Random(f"{jitter.seed}:c:{g}:{k}"), jitter.compute_cv)
                         for k in range(len(st))] if jitter else [] for g, st in enumerate(self.steps)]
        self.jobs: list[deque] = [deque(sorted((prefill or {}).get(self._name(g), []), key=lambda j: j.start_s))
                                  for g in range(n)]
        self.running: list[list | None] = [None] * n  # [job, segment start or None when paused, seconds left]
        self.pf_version = [0] * n
        self.ar_until = [0.0] * n  # the group's gradient all-reduce holds it until then
        self.prefill_done: list[tuple[tuple, str, float, float]] = []  # (key, group, first start, end)
        self.prefill_skipped: list[tuple[tuple, str, float]] = []
        self.kv_carry = list(kv_carry or [])
        self.stop_kv_at_s = stop_kv_at_s  # record what KV flows have left then (the iteration's end)
        self.kv_flows: dict[Flow, KvShipment] = {}  # on a link now
        self.kv_done: list[KvDone] = []
        self.kv_left: list[KvShipment] = []  # still on a link at stop_kv_at_s, with the bytes left then

    def _classes(self) -> dict[int, list[int]]:
        return {r: [r] for r in range(self.p.dp)} if self.realised else super()._classes()

    def run(self) -> Timeline:
        p = self.p
        for k, r in enumerate(self.reps):
            for s in range(p.pp):
                self.push(p.replica_offset_s[r], self.try_start, k * p.pp + s)
        for g, jobs in enumerate(self.jobs):
            for j in jobs:
                self.push(j.start_s, self._prefill_due, g)
        for c in self.kv_carry:
            self.push(0.0, self._kv_start, c)
        if self.stop_kv_at_s is not None:
            self.push(self.stop_kv_at_s, self._kv_snapshot)
        self._loop()
        if any(self.ptr[g] < len(self.steps[g]) for g in range(len(self.ptr))):
            raise RuntimeError(f"{p.run_id}: simulation deadlocked (a schedule waits on input that never comes)")
        return Timeline.from_sim(p, self.out, self.reps, self.copies)

    # --- compute --------------------------------------------------------------------------
    def try_start(self, g: int) -> None:
        """Run g's program until it blocks: on a Recv whose message has not arrived, or on compute."""
        if self.busy[g] or self.now < self.offset[g]:
            return
        steps = self.steps[g]
        k = self.ptr[g]
        while k < len(steps):
            st = steps[k]
            op = st[0]
            if op == RECV:
                if self.arrival[g][st[1]] == INF:
                    break
            elif op == SEND:
                j = 2 * g + st[6]
                if self.pipe_link[j] is None:
                    self._send_local(g, g + st[1], j, st)
                else:
                    self._send_wan(g, g + st[1], st[2], st[3], st[4], self.pipe_link[j], st[5])
            elif op == ALLREDUCE:
                self.ptr[g] = k + 1
                self.stage_finished(g % self.p.pp, g, st[1])
            else:  # COMPUTE
                self.ptr[g] = k
                self.busy[g] = True
                t0 = self._yield_prefill(g)
                secs = st[1] * (self.cfactor[g][k] if self.rng else 1.0)
                self.push(t0 + secs, self.compute_done, g, st, t0)
                return
            k += 1
        self.ptr[g] = k
        if (self.jobs[g] or self.running[g]) and self._blocked(g):
            self._prefill_idle(g)

    def compute_done(self, g: int, st: tuple, t0: float) -> None:
        self.out.append((g, st[2], st[3], t0, self.now, 0.0))
        self.busy[g] = False
        self.ptr[g] += 1
        self.try_start(g)

    def _send_local(self, src: int, dst: int, j: int, st: tuple) -> None:
        """A transfer inside a DC: it leaves when its pipe is free, at the fabric's rate times the noise."""
        _, _, kind, i, nbytes, idx, _d = st
        start = max(self.now, self.pipe_free[j])
        end = start + nbytes / self.pipe_bw[j] * self._delay(src, dst, kind, i)
        self.pipe_free[j] = end
        arrive = end + self.pipe_lat[j]
        self.out.append((src, "send", i, self.now, end, nbytes))
        self.out.append((dst, "recv", i, self.now, arrive, nbytes))
        self.push(arrive, self._arrive, dst, idx)

    def _deliver(self, g: int, idx: int, arrive: float) -> None:
        self.push(arrive, self._arrive, g, idx)

    def _arrive(self, g: int, idx: int) -> None:
        self.arrival[g][idx] = self.now
        self.try_start(g)

    def _delay(self, *what) -> float:
        if not self.rng:
            return 1.0
        return _lognormal(random.Random(f"{self.jitter.seed}:t:{what}"), self.jitter.wan_cv)

    # --- prefill in the bubbles --------------------------------------------------------------
    def _prefill_due(self, g: int) -> None:
        if not self.busy[g] and self._blocked(g):
            self._prefill_idle(g)

    def _blocked(self, g: int) -> bool:
        """g is idle: waiting for a message, or done with its program."""
        steps, k = self.steps[g], self.ptr[g]
        if self.now < self.ar_until[g] - 1e-12:
            return False
        return k >= len(steps) or steps[k][0] == RECV or self.now < self.offset[g]

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
        self._ship_kv(g, j, self.now)
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
            self._ship_kv(g, j, t)
        else:
            run[1], run[2] = None, t0 + left - t
        return t

    # --- KV caches on the WAN --------------------------------------------------------------
    def _ship_kv(self, g: int, j: PrefillJob, t: float) -> None:
        """Job j ended at t (now or at a layer boundary ahead): its KV cache leaves for its home DC then."""
        if j.kv is None:
            return
        dst, nbytes = j.kv
        src = self.p.stage_dc[self.replica(g)][g % self.p.pp]
        ship = KvShipment(j.key, src, dst, nbytes, t)
        if t > self.now:
            self.push(t, self._kv_start, ship)
        else:
            self._kv_start(ship)

    def _kv_start(self, ship: KvShipment) -> None:
        """Inside a DC the fabric carries it (latency + bytes / bandwidth, no contention, as a pipe there);
        across DCs it is a flow on the direct WAN link (KV_RANK under temporal sharing). One that leaves at the
        iteration's end, after `_kv_snapshot` ran, goes whole to the next iteration."""
        if self.stop_kv_at_s is not None and self.now >= self.stop_kv_at_s and ship.src != ship.dst:
            self.kv_left.append(KvShipment(ship.key, ship.src, ship.dst, ship.nbytes, ship.started_s - self.now))
            return
        if ship.src == ship.dst:
            intra = self.p.intra[ship.src]
            end = self.now + ship.nbytes / intra.bandwidth_bytes_s
            self.kv_done.append(KvDone(ship.key, ship.src, ship.dst, ship.nbytes, end, end + intra.latency_s))
            return
        link = (ship.src, ship.dst)
        lp, ls = self.lp.get(link), self.links.get(link)
        if lp is None or ls is None:
            raise ValueError(f"no WAN link {ship.src} -> {ship.dst} for a KV cache (BubbleTea needs direct links)")
        flow = Flow(ship.nbytes, lp.transfer_cap_bytes_s, KV_RANK, (ship, None, "kv", -1, lp, self.now, ls),
                    window=lp.connections * lp.window_bytes, group="kv")
        self.kv_flows[flow] = ship
        ls.add(flow, self.now)

    def _flow_done(self, flow: Flow) -> None:
        if flow.payload[2] != "kv":
            super()._flow_done(flow)
            return
        ship, lp, ls = flow.payload[0], flow.payload[4], flow.payload[6]
        ls.remove(flow, self.now)
        del self.kv_flows[flow]
        self.kv_done.append(KvDone(ship.key, ship.src, ship.dst, ship.nbytes, self.now, self.now + lp.latency_s))

    def _kv_snapshot(self) -> None:
        """The iteration ends now: what each KV flow has left to send goes on in the next one (read only: the
        flows run on here, and their later ends are not the caller's to count)."""
        for f, ship in self.kv_flows.items():
            left = f.remaining - f.rate * (self.now - f.t_last) if f.rate else f.remaining
            if left > ship.nbytes * 1e-12:  # else its end is due now: counted in kv_done
                self.kv_left.append(KvShipment(ship.key, ship.src, ship.dst, left, ship.started_s - self.now))

    def _name(self, g: int) -> str:
        return group_name(g % self.p.pp, self.replica(g))

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


def realise(plan: Plan, jitter: Jitter | None, prefill: dict[str, list[PrefillJob]] | None = None,
            kv_carry: list[KvShipment] | None = None, carry_kv: bool = False) -> Realisation:
    """One realised iteration (see the module docstring); the Realisation keeps what its prefill did.
    `kv_carry`: KV flows left by the iteration before, on the links from its start. `carry_kv`: KV flows still
    sending on a WAN link when this iteration ends are cut there (`sim.kv_left`, bytes left; `sim.kv_done` holds
    those whose last byte left by then, and those inside a DC); the run is repeated with a mark at that end,
    which the first run finds."""
    with paused_gc():
        sim = Realisation(plan, jitter, prefill, kv_carry)
        sim.timeline = sim.run()
        end = sim.timeline.iteration_s[0]
        if carry_kv and any(d.left_s > end and d.src != d.dst for d in sim.kv_done):
            sim = Realisation(plan, jitter, prefill, kv_carry, stop_kv_at_s=end)
            sim.timeline = sim.run()
            sim.kv_done = [d for d in sim.kv_done if d.left_s <= end or d.src == d.dst]  # inside a DC: not cut
    return sim

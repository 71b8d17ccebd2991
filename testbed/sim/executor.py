"""Discrete-event execution of a Plan's lowered programs (plan/lower.py) into a Timeline.

Each (replica, stage) group runs its program in order: a Recv waits for its message, Forward and
Backward occupy the group for their time, a Send queues its message and goes on, and the AllReduce
joins the stage's replicas (the emulated workers execute the same programs). The transfers between two groups in one
direction travel on one set of TCP connections, a FIFO pipe: each transfer starts when the one before
it has left (as NCCL send/recv on one communicator, or our workers' striped sockets, queue successive
messages). Inside a DC a pipe costs latency + bytes/bandwidth with no contention between pipes; across
DCs the pipe's head transfer is a flow on a WAN link (see network.py) and arrives one propagation
latency after its last byte leaves.

A WAN pipe's n connections keep at most n x W bytes unacknowledged, and an acknowledgement comes back
one round trip after its byte left (`SlidingWindow`): a pipe sends what its window has free at whatever
share of the link it gets, and the bytes it sent come free again one round trip after they started to
leave. Alone on a link that is n x W per RTT on average, but a transfer starting on an idle pipe gets
its first window out at the link's rate, so a transfer of q windows takes (q - 1) round trips plus one
window's time on the link, not q round trips (bench/tcp_fidelity.py measured it on the emulated WAN).
A transfer that follows soon after another gets only what the one before left free, and the rest as the one before's
bytes come back, as a TCP window slides. After a stage's last backward on every replica its gradients are
all-reduced (ring inside the DC; hierarchical with a ring across DCs for dp-wan-overlap, step by step as every ring
across DCs is: sim/wan_ring.py). With the `overlap` mechanism the programs issue bucketed reduce-scatters and
all-gathers instead and wait for them where they need them (sim/collectives.py). A sync period's program (DiLoCo,
testbed/plan/diloco.py) instead JOINs each of its collectives and waits for its end where the program says
(testbed/sim/sync.py). The iteration ends when every all-reduce or collective is done.

Replicas that are provably symmetric (the same placement, costs and start time) would run identical
timelines, but where their transfers meet on a fair-shared WAN link the round robin serves them one turn of
the link apart (`round_robin_lags`), and from there they drift: each head start is simulated (at most
ROUND_ROBIN_PHASES per symmetric set, consecutive replicas sharing one), standing for its replicas, whose
flows count once each in the link's sharing. Symmetric replicas with no WAN link are simulated once.
Under temporal sharing replicas take turns, so every replica is simulated, except in the lower-bound run,
which uses no WAN link, and past the full simulation's size, where blocks of replicas consecutive in the turn
order are (testbed/sim/aggregate.py; a sync period past it: testbed/sim/period.py).

A WAN that changes during the iteration (testbed/sim/linkchange.py) re-rates its links at each change; a
realised iteration (timing noise, BubbleTea's prefill jobs) runs on testbed/sim/realised.py.

Speed (docs/simulator-speed.md): one group is lowered per program shape (plan/lower.py program_shape)
and its steps compiled to plain tuples shared by every group of that shape. A group's program depends on
nothing but its messages' arrival times, so each group runs ahead of the event clock until it waits for a
message not sent yet: compute and transfers inside a DC cost no events. The event loop keeps what groups
share, at the time a group reaches it: WAN transfers (flows on their link) and the all-reduce. Its
events sit in per-time buckets under a heap of distinct times; at one time, transfers that end go first,
then events in the order they were caused (when the compute that issued a transfer started, when a flow's
rate was set), then in the order they were pushed.
"""

from __future__ import annotations

import gc
import heapq
from collections import defaultdict, deque
from contextlib import contextmanager

from testbed.plan.lower import allreduce, lower_group, program_shape
from testbed.plan.plan import Plan
from testbed.plan.turns import TURN_KEYS
from testbed.program import (
    AllGather,
    AllReduce,
    Await,
    Backward,
    BackwardWeight,
    Forward,
    Optimizer,
    OuterSync,
    OuterWait,
    Recv,
    ReduceScatter,
    Send,
    await_slot,
)
from testbed.sim.aggregate import turn_block, turn_blocks
from testbed.sim.collectives import Collectives
from testbed.sim.linkchange import LiveLinks, WanSchedule
from testbed.sim.network import Flow, LinkState, SlidingWindow  # noqa: F401 (SlidingWindow: re-exported)
from testbed.sim.sync import SyncCollectives
from testbed.sim.wan_ring import WanRing
from testbed.timeline import Timeline, group_name

# compiled step opcodes (the first item of a step tuple)
RECV, SEND, COMPUTE, ALLREDUCE, ISSUE, AWAIT, JOIN = range(7)
# event codes (the first item of an event tuple)
EV_FLOW, EV_SEND, EV_CALL = range(3)
INF = float("inf")


def _order(ev: tuple) -> tuple:
    """The order of events at one time: transfers that end first (a flow whose last byte leaves now is
    done, not overtaken by a transfer issued now), then by when each was caused; a stable sort keeps
    push order after that."""
    return (ev[0] != EV_FLOW, ev[1])

# The Atlas sidecar learns that a transfer started or ended from the workers' notices: the sender's when it
# issues the transfer, the receiver's once its last byte has arrived (runtime/sidecar.py), and a notice takes this
# long to become an HTB change (measured by the sidecar on the emulated WAN: notice, netlink change;
# docs/fidelity.md). Until then the transfer still ranks its replica.
SIDECAR_REACTION_S = 0.5e-3
IDLE_RANK = (float("inf"),)  # a replica with no transfer the sidecar knows of: after every other


def first_wan_pipe(plan: Plan, r: int) -> tuple[int, tuple[str, str]] | None:
    """Replica r's first stage boundary that crosses the WAN, as (stage, link): its first WAN transfer."""
    row = plan.stage_dc[r]
    for s in range(plan.pp - 1):
        if row[s] != row[s + 1]:
            return s, (row[s], row[s + 1])
    return None


def _symmetric(plan: Plan) -> list[list[int]]:
    """Replicas with the same placement, costs, start time and share of the batch, in replica order: they run
    alike."""
    classes: dict[tuple, list[int]] = {}
    for r in range(plan.dp):
        key = (tuple(plan.stage_dc[r]), tuple(plan.fwd_s[r]), tuple(plan.bwd_s[r]), plan.replica_offset_s[r],
               plan.microbatches_of(r))
        classes.setdefault(key, []).append(r)
    return list(classes.values())


# At most this many distinct head starts per symmetric set of replicas (round_robin_lags): a bound on the cost,
# not a fitted constant. Fair sharing re-rates every flow on a link at each change, so k replicas simulated
# apart cost about k^2 x what one merged class does; with more replicas than this, consecutive replicas share a
# head start in equal blocks, each block simulated once (docs/simulator-speed.md).
ROUND_ROBIN_PHASES = 8


def round_robin_lags(plan: Plan) -> list[float]:
    """[replica] -> how long after the first of the replicas symmetric to it its first WAN transfer gets the
    link, under fair sharing. The wire shares a link between replicas by round robin (a real link frame by frame;
    the emulator an HTB class per replica, one quantum per turn: testbed/runtime/htb.py), not as a fluid:
    symmetric replicas' first transfers reach their link at the same instant, and the first in the round is then
    a turn (the link's `turn_bytes`) ahead of the second, which is a turn ahead of the third. Exactly in step they
    would sit on an unstable equilibrium (docs/fidelity.md, "Replicas in lockstep"); this head start is where they
    leave it. The k-th replica of a
    symmetric set waits k turns' time on its first WAN link (in blocks beyond ROUND_ROBIN_PHASES replicas);
    0 under temporal sharing (the sidecar orders the replicas) and in the lower-bound run (no WAN link)."""
    lags = [0.0] * plan.dp
    if plan.ideal_wan or plan.dp < 2:
        return lags
    for rs in _symmetric(plan):
        first = first_wan_pipe(plan, rs[0])
        if first is None or plan.links[first[1]].temporal:
            continue
        n = len(rs)
        phases = min(n, ROUND_ROBIN_PHASES)
        lp = plan.links[first[1]]
        turn_s = lp.turn_bytes / lp.capacity_bytes_s
        for k, r in enumerate(rs):
            lags[r] = (k * phases // n) * turn_s * n / phases
    return lags


def replica_classes(plan: Plan, block: int | None = None) -> dict[int, list[int]]:
    """Replica -> the replicas it stands for (itself first). Symmetric replicas share one entry, or where they
    meet on a fair-shared link, one entry per head start the round robin gives them (`round_robin_lags`).
    Under temporal sharing replicas take turns on the WAN, so each is its own class, except in the lower-bound
    run (`ideal_wan`), where no transfer touches a WAN link, and past the full simulation's size, where blocks of
    `block` replicas consecutive in the turn order are (testbed/sim/aggregate.py; None: `turn_block`'s choice)."""
    if not plan.ideal_wan and any(lp.temporal for lp in plan.links.values()):
        return turn_blocks(plan, turn_block(plan) if block is None else block)
    lags = round_robin_lags(plan)
    out: dict[int, list[int]] = {}
    for rs in _symmetric(plan):
        by_lag: dict[float, list[int]] = {}
        for r in rs:
            by_lag.setdefault(lags[r], []).append(r)
        out.update({group[0]: group for group in by_lag.values()})
    return dict(sorted(out.items()))


def message_index(kind: str, microbatch: int, chunk: int, m: int) -> int:
    """A message's place in its receiver's arrival flags: per model chunk, m activations then m gradients."""
    return 2 * m * chunk + (microbatch if kind == "a" else m + microbatch)


def peer_offsets(s: int, r: int, pp: int, wrap: bool) -> dict[str, tuple[int, int]]:
    """Group (s, r)'s pipeline peers as (group offset, direction: 0 towards the next stage, 1 the previous),
    written relative to the group so that groups of one shape share the compiled steps. With virtual stages
    (`wrap`) the last stage's next is the first; one peer on both sides (two stages) is one pipe, direction 0."""
    if not wrap:
        return {group_name(s + 1, r): (1, 0), group_name(s - 1, r): (-1, 1)}
    prv, nxt = (s - 1) % pp, (s + 1) % pp
    return {group_name(prv, r): (prv - s, 1), group_name(nxt, r): (nxt - s, 0)}


def compile_steps(steps: tuple, s: int, r: int, m: int, pp: int = 0, wrap: bool = False,
                  blocking: bool = False) -> tuple[tuple, ...]:
    """Group (s, r)'s steps as tuples the event loop reads without attribute lookups; a message's index
    in the receiver's arrival flags is `message_index`. Peers are the neighbouring stages of the same replica
    (`peer_offsets`). With `blocking` (a sync period's program: testbed/plan/diloco.py) each collective is a
    JOIN and the end it waits for is a flag after the messages': the h-th AllReduce's at 2m + h (a RECV right
    after it), fragment f's OuterSync's at 2m + (AllReduces) + f (its OuterWait's RECV)."""
    peers = peer_offsets(s, r, pp, wrap)
    out: list[tuple] = []
    n_ar = sum(1 for st in steps if type(st) is AllReduce) if blocking else 0
    h = 0
    for st in steps:
        t = type(st)
        if t is Recv:
            out.append((RECV, message_index(st.kind, st.microbatch, st.chunk, m)))
        elif t is Send:
            if st.peer not in peers:
                raise ValueError(f"{group_name(s, r)} sends to {st.peer}, not a neighbouring stage of its replica")
            off, d = peers[st.peer]
            idx = message_index(st.kind, st.microbatch, st.chunk, m)
            out.append((SEND, off, st.kind, st.microbatch, st.bytes, idx, d))
        elif t is Forward or t is Backward or t is BackwardWeight:  # W is backward work on the timeline
            out.append((COMPUTE, st.seconds, "fwd" if t is Forward else "bwd", st.microbatch))
        elif t is AllReduce and blocking:
            out += [(JOIN, st, 2 * m + h, ("ar", h)), (RECV, 2 * m + h)]
            h += 1
        elif t is AllReduce:
            out.append((ALLREDUCE, st))
        elif t is ReduceScatter or t is AllGather:
            out.append((ISSUE, st, st.after_s if t is ReduceScatter else 0.0))
        elif t is Await:
            out.append((AWAIT, 2 * m + await_slot(st.collective, st.bucket), st.lead_s))
        elif t is Optimizer:
            out.append((COMPUTE, st.seconds, "optimizer", -1))
        elif t is OuterSync:
            out.append((JOIN, st, 2 * m + n_ar + st.fragment, ("os", st.fragment)))
        elif t is OuterWait:
            out.append((RECV, 2 * m + n_ar + st.fragment))
        else:
            raise TypeError(f"{group_name(s, r)}: the simulator does not execute {t.__name__} steps")
    return tuple(out)


class Simulation(SyncCollectives):
    event_order = staticmethod(_order)  # the order of events at one time (None: push order)

    def __init__(self, plan: Plan, wan: WanSchedule | None = None, t0: float = 0.0, turn_block: int | None = None
                 ) -> None:
        self.p = plan
        self.turn_block = turn_block  # replicas taking turns simulated as one (None: testbed/sim/aggregate.py's choice)
        self.heap: list[float] = []  # the distinct times that have events, a heap
        self.buckets: dict[float, list[tuple]] = {}  # time -> its events, in push order
        self.now = 0.0
        self.copies = self._classes()
        self.reps = list(self.copies)  # simulated replicas; group g = k * pp + s for replica reps[k]
        self.weight = [len(self.copies[r]) for r in self.reps]
        P, m = plan.pp, plan.microbatches * plan.steps_per_program  # messages per program
        self.msgs = m
        n = P * len(self.reps)
        self.steps = self._compile()  # index g = k * pp + s
        self.ptr = [0] * n  # each group's next step
        self.clock = [plan.replica_offset_s[r] for r in self.reps for _ in range(P)]  # when it reached that step
        self.waits = [-1] * n  # the message a blocked group waits for (-1: none)
        # when each message reaches its group (INF: not sent yet): [g][microbatch] activations, [g][m + microbatch]
        # gradients
        # then [g][2m + await_slot] when each of its bucketed collectives ends, or a sync period's collectives'
        # ends after the messages' flags (compile_steps)
        slots = max((x[1] + 1 for steps in self.steps for x in steps if x[0] == AWAIT), default=0)
        extra = plan.steps_per_program + plan.diloco.fragments if plan.diloco is not None else 0
        self.arrival = [[INF] * max(slots, 2 * m * plan.virtual_stages + extra) for _ in range(n)]
        self.collectives = Collectives(self)
        self.stage_done = [0] * P
        self.out: list[tuple] = []  # (group, kind, microbatch, start, end, bytes)
        self.links = {
            k: LinkState(lp.capacity_bytes_s, lp.temporal, self._schedule_flow) for k, lp in plan.links.items()
        }
        self.lp = dict(plan.links)  # each link as it is now (a changing WAN replaces entries)
        turn_pos = {r: i for i, r in enumerate(plan.turn_order)}
        self.turn_rank = [turn_pos[r] for r in self.reps]  # [k]: replica reps[k]'s place in the turn order
        self.turn_key = TURN_KEYS[plan.turn_policy]
        # per group and direction (2g: to the next stage, 2g+1: to the previous): the WAN link a pipe
        # crosses ((from DC, to DC), None inside a DC), the DC fabric's bandwidth and latency, and when its
        # last byte leaves
        self.pipe_link: list = [None] * (2 * n)
        self.pipe_bw = [0.0] * (2 * n)
        self.pipe_lat = [0.0] * (2 * n)
        self.pipe_free = [0.0] * (2 * n)
        for k, r in enumerate(self.reps):
            row = plan.stage_dc[r]
            for s in range(P):
                a = row[s]
                for d, q in ((0, s + 1), (1, s - 1)):
                    if plan.virtual_stages > 1:  # the chunks wrap from the last stage to the first
                        q %= P
                    j = 2 * (k * P + s) + d
                    intra = plan.intra[a]
                    self.pipe_bw[j], self.pipe_lat[j] = intra.bandwidth_bytes_s, intra.latency_s
                    if 0 <= q < P and row[q] != a and not plan.ideal_wan:
                        self.pipe_link[j] = (a, row[q])
        self.pipes: dict[tuple[int, int], deque] = defaultdict(deque)  # (src, dst) -> queued WAN transfers
        # (src, dst) -> when a replica's first WAN pipe first gets the link: its round-robin lag after the
        # moment its first transfer is issued (round_robin_lags); used once
        self.lag: dict[tuple[int, int], float] = {}
        lags = round_robin_lags(plan)
        for k, r in enumerate(self.reps):
            first = first_wan_pipe(plan, r)
            if lags[r] > 0 and first is not None:
                g = k * P + first[0]
                self.lag[(g, g + 1)] = lags[r]
        self.windows: dict[tuple[int, int], SlidingWindow] = {}  # (src, dst) -> its connections' window
        # temporal links: (link, replica) -> the turn keys of its transfers the sidecar knows to be in flight
        self.known: dict[tuple, list[tuple]] = defaultdict(list)
        # temporal links: (link, replica) -> its transfers' flows on the link now, in the order they were added
        # (an ordered set: the sidecar re-ranks just these, not every flow on the link)
        self.on_link: dict[tuple, dict[Flow, None]] = defaultdict(dict)
        self.init_collectives()
        self.events = 0
        self.wan = LiveLinks(self, wan, t0) if wan is not None else None  # the schedule's clock is t0 + now

    def _classes(self) -> dict[int, list[int]]:
        return replica_classes(self.p, self.turn_block)

    def pending(self) -> bool:
        """Whether the iteration goes on: events at later times, or groups not at their program's end (the
        events left at the current time belong to one of those)."""
        return bool(self.heap) or any(k < len(st) for k, st in zip(self.ptr, self.steps, strict=True))

    def _compile(self) -> list[tuple]:
        """Each simulated group's compiled steps; groups of one program shape share one lowering."""
        p = self.p
        reduces = [allreduce(p, s) if p.dp > 1 else None for s in range(p.pp)]  # shared by the stage's groups
        shared: dict[tuple, tuple] = {}
        out = []
        for r in self.reps:
            for s in range(p.pp):
                key = program_shape(p, s, r)
                if key not in shared:
                    shared[key] = compile_steps(lower_group(p, s, r, reduces[s]).steps, s, r, self.msgs, p.pp,
                                                p.virtual_stages > 1, p.diloco is not None)
                out.append(shared[key])
        return out

    def replica(self, g: int) -> int:
        return self.reps[g // self.p.pp]

    # --- event plumbing -------------------------------------------------------------------
    def _push_event(self, t: float, ev: tuple) -> None:
        b = self.buckets.get(t)
        if b is None:
            self.buckets[t] = [ev]
            heapq.heappush(self.heap, t)
        else:
            b.append(ev)

    def push(self, t: float, fn, *args) -> None:
        """Call fn(*args) at time t (after the events already pushed for t)."""
        self._push_event(t, (EV_CALL, self.now, fn, args))

    def _schedule_flow(self, t: float, flow: Flow, version: int) -> None:
        self._push_event(t, (EV_FLOW, self.now, flow, version))

    def run(self) -> Timeline:
        p = self.p
        if self.wan is not None:
            self.wan.start()
        self._drain(list(range(len(self.steps) - 1, -1, -1)))  # every group from its start, group 0 first
        self._loop()
        if any(self.ptr[g] < len(self.steps[g]) for g in range(len(self.ptr))):
            raise RuntimeError(f"{p.run_id}: simulation deadlocked (a schedule waits on input that never comes)")
        return Timeline.from_sim(p, self.out, self.reps, self.copies)

    def _loop(self) -> None:
        """The event loop: WAN transfers and all-reduces, in time order; events at one time as `_order`
        says."""
        times, buckets = self.heap, self.buckets
        pop = heapq.heappop
        order = self.event_order
        events = 0
        while times:
            now = pop(times)
            batch = buckets.pop(now)
            self.now = now
            events += len(batch)
            if order is not None and len(batch) > 1:
                batch.sort(key=order)
            for ev in batch:
                code = ev[0]
                if code == EV_FLOW:
                    flow = ev[2]
                    if ev[3] == flow.version:  # else superseded by a rate change
                        self._flow_done(flow)
                elif code == EV_SEND:
                    g, st = ev[2], ev[3]
                    self._send_wan(g, g + st[1], st[2], st[3], st[4], self.pipe_link[2 * g + st[6]], st[5])
                else:
                    ev[2](*ev[3])
        self.events += events

    def _drain(self, ready: list[int]) -> None:
        """Run the groups in `ready` (and those their messages wake) each until it blocks on a message that
        has not been sent yet. A group's program depends on nothing but its messages' arrival times, so it
        runs ahead of the event loop's clock on its own: a step starts when the group is free and its
        message has arrived (the later of the two), a compute ends `seconds` later, and a transfer inside a
        DC leaves when its pipe is free. Only what other groups share is left to the event loop, at the
        time the group reaches it: a transfer across the WAN (its link) and the all-reduce (the stage)."""
        P = self.p.pp
        steps_of, ptr, clock, waits, arr = self.steps, self.ptr, self.clock, self.waits, self.arrival
        out_append = self.out.append
        pipe_link, pipe_bw, pipe_lat, pipe_free = self.pipe_link, self.pipe_bw, self.pipe_lat, self.pipe_free
        push_event = self._push_event
        while ready:
            g = ready.pop()
            steps, a, k, t = steps_of[g], arr[g], ptr[g], clock[g]
            t0 = t  # when the last compute started: the cause of the WAN transfer or all-reduce that follows it
            n = len(steps)
            while k < n:
                st = steps[k]
                op = st[0]
                if op == COMPUTE:
                    t0, t1 = t, t + st[1]
                    out_append((g, st[2], st[3], t0, t1, 0.0))
                    t = t1
                elif op == RECV:
                    ta = a[st[1]]
                    if ta > t:
                        if ta == INF:
                            waits[g] = st[1]
                            break
                        t = ta
                elif op == SEND:
                    j = 2 * g + st[6]
                    if pipe_link[j] is None:  # inside a DC: FIFO on the fabric, no contention
                        dst, idx, nbytes = g + st[1], st[5], st[4]
                        free = pipe_free[j]
                        end = (t if t >= free else free) + nbytes / pipe_bw[j]
                        pipe_free[j] = end
                        arrive = end + pipe_lat[j]
                        out_append((g, "send", st[3], t, end, nbytes))
                        out_append((dst, "recv", st[3], t, arrive, nbytes))
                        arr[dst][idx] = arrive
                        if waits[dst] == idx:
                            waits[dst] = -1
                            ready.append(dst)
                    else:
                        push_event(t, (EV_SEND, t0, g, st))
                elif op == ALLREDUCE:
                    push_event(t, (EV_CALL, t0, self.stage_finished, (g % P, g, st[1])))
                elif op == ISSUE:  # a bucketed collective, issued st[2] into the compute that follows
                    push_event(t + st[2], (EV_CALL, t0, self.collectives.issue, (g, st[1])))
                elif op == AWAIT:  # the next compute may start st[2] before the collective ends
                    ta = a[st[1]]
                    if ta == INF:
                        waits[g] = st[1]
                        break
                    if ta - st[2] > t:
                        out_append((g, "allreduce", -1, t, ta - st[2], 0.0))  # the collective's exposed time
                        t = ta - st[2]
                else:  # JOIN: a sync period's collective (testbed/sim/sync.py)
                    push_event(t, (EV_CALL, t0, self.join, (g, st[1], st[2], st[3])))
                k += 1
            ptr[g] = k
            clock[g] = t

    def wake(self, groups: list[int]) -> None:
        """Groups whose awaited collective has ended go on."""
        if groups:
            self._drain(groups)

    def _deliver(self, g: int, idx: int, arrive: float) -> None:
        """A message for g arrives at `arrive`; g goes on if it was waiting for it."""
        self.arrival[g][idx] = arrive
        if self.waits[g] == idx:
            self.waits[g] = -1
            self._drain([g])

    # --- transfers ------------------------------------------------------------------------
    def _send_wan(self, src: int, dst: int, kind: str, i: int, nbytes: float, link: tuple[str, str],
                  idx: int) -> None:
        """Queue a transfer on the (src, dst) pipe across the WAN; it leaves after the transfers queued before it.
        Under temporal sharing the sidecar hears of it SIDECAR_REACTION_S later. `idx`: its place in the
        receiver's arrival flags."""
        pipe = self.pipes[(src, dst)]
        k = src // self.p.pp
        key = self.turn_key(i, self.turn_rank[k], kind, self.now)
        pipe.append([kind, i, nbytes, self.now, nbytes, key, idx])  # [4]: bytes not yet sent
        if self.links[link].temporal:
            self._notice(link, self.reps[k], key, True, self.now)
        lag = self.lag.pop((src, dst), 0.0) if self.lag else 0.0
        if lag > 0:  # the first frames of the replicas before it go first
            self.push(self.now + lag, self._send_head, src, dst, link)
        elif len(pipe) == 1:
            self._send_head(src, dst, link)

    def rank(self, link: tuple[str, str], r: int) -> tuple:
        """A replica's place in the turns on a link, as the sidecar ranks it: by the smallest turn key of its
        transfers there that it knows to be in flight (from the start notice until the end notice)."""
        keys = self.known.get((link, r))
        return (min(keys), r) if keys else (IDLE_RANK, r)

    def _notice(self, link: tuple[str, str], r: int, key: tuple, start: bool, heard: float) -> None:
        """A transfer on a link that takes turns starts (`start`) or ends. The predictive sidecar knows a start from
        the plan's schedule (its worker announced it as the compute producing it began) and ranks it now; an end it
        observes, as the last byte leaves the shaper, and acts SIDECAR_REACTION_S later. The reactive one hears the
        worker's notice at `heard` (the sender's as it issues, the receiver's once the last byte arrived) and acts
        SIDECAR_REACTION_S later."""
        if self.p.sidecar == "predictive":
            if start:
                self._sidecar(link, r, key, start)
            else:
                self.push(self.now + SIDECAR_REACTION_S, self._sidecar, link, r, key, start)
        else:
            self.push(heard + SIDECAR_REACTION_S, self._sidecar, link, r, key, start)

    def _sidecar(self, link: tuple[str, str], r: int, key: tuple, start: bool) -> None:
        """A notice reaches the sidecar: re-rank the replica's flows on the link."""
        keys = self.known[(link, r)]
        if start:
            keys.append(key)
        else:
            keys.remove(key)
        ls = self.links[link]
        prio = self.rank(link, r)
        for f in list(self.on_link[(link, r)]):
            ls.reprioritize(f, prio, self.now)

    def _send_head(self, src: int, dst: int, link: tuple[str, str]) -> None:
        """Put as much of the pipe's head transfer on the link as its window allows now, or wait until the oldest
        piece in flight comes free."""
        kind, i, _nbytes, t_issue, left, _key, _idx = self.pipes[(src, dst)][0]
        lp = self.lp[link]  # as the link is now (a changing WAN's latency changes the round trip)
        win = self.windows.get((src, dst))
        if win is None:
            win = self.windows[(src, dst)] = SlidingWindow(lp.connections * lp.window_bytes, lp.rtt_s)
        win.rtt_s = lp.rtt_s
        budget = win.budget(self.now) if lp.rtt_s > 0 else INF
        if budget <= left * 1e-12:
            self.push(win.next_free_s(), self._send_head, src, dst, link)
            return
        k = src // self.p.pp
        ls = self.links[link]
        flow = Flow(min(left, budget), INF, (), (src, dst, kind, i, lp, t_issue, ls), self.weight[k])
        if lp.rtt_s > 0:
            win.sent(self.now, flow.nbytes)
        if ls.temporal:
            flow.prio = self.rank(link, self.reps[k])
            self.on_link[(link, self.reps[k])][flow] = None
        ls.add(flow, self.now)

    def _flow_done(self, flow: Flow) -> None:
        src, dst, kind, i, lp, t_issue, link = flow.payload
        now = self.now
        link.remove(flow, now)
        if kind == "rs":  # a bucket's reduce-scatter across DCs (sim/collectives.py)
            src[0](*src[1:])
            return
        if kind == "ring":  # a piece of a ring's step across DCs (sim/wan_ring.py)
            src.part_done(i)
            return
        key = (lp.src, lp.dst)
        if link.temporal:
            del self.on_link[(key, self.replica(src))][flow]
        pipe = self.pipes[(src, dst)]
        head = pipe[0]
        head[4] -= flow.nbytes
        self.windows[(src, dst)].ended(now)  # its flow came from _send_head, which made the window
        if head[4] > head[2] * 1e-12:
            self._send_head(src, dst, key)  # the window ran out: the rest goes as pieces come free
            return
        arrive = now + self.lp[key].latency_s * self._delay(src, dst, kind, i)
        self.out.append((src, "send", i, t_issue, now, head[2]))
        self.out.append((dst, "recv", i, t_issue, arrive, head[2]))
        self._deliver(dst, head[6], arrive)
        if link.temporal:  # the receiver's end notice (predictive: observed as the last byte leaves)
            self._notice(key, self.replica(src), head[5], False, arrive)
        pipe.popleft()
        if pipe:
            self._send_head(src, dst, key)

    def _delay(self, *what) -> float:
        """The factor on a transfer's delay (1: the plan's timing; realised iterations draw it)."""
        return 1.0

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
            bw = min(p.intra[d].bandwidth_bytes_s for d in by_dc)
            lat = max(p.intra[d].latency_s for d in by_dc)
            n = p.dp
            dur = 2 * (n - 1) / n * G / bw + 2 * (n - 1) * lat if n > 1 else 0.0
            self._allreduce_interval(s, self.now, self.now + dur)
            return
        # hierarchical: reduce-scatter in each DC, ring all-reduce across DCs, all-gather in each DC
        local = max(2 * (len(rs) - 1) / len(rs) * G / p.intra[d].bandwidth_bytes_s for d, rs in by_dc.items())
        self.push(self.now + local / 2, self._start_wan_allreduce, s, self.now, local / 2, dict(by_dc), ar)

    def _start_wan_allreduce(self, s: int, t0: float, tail: float, by_dc: dict[str, list[int]], ar: AllReduce) -> None:
        """The ring across DCs step by step (sim/wan_ring.py), then the all-gather inside each DC (`tail`)."""
        ring = [d for d in self.p.gpu_types if d in by_dc]  # topology order
        hops = list(zip(ring, ring[1:] + ring[:1], strict=True))
        WanRing(self, hops, ar.wan_connections, ar.bytes, (float("inf"), s),
                lambda ends: self._allreduce_interval(s, t0, max(ends) + tail)).start(self.now)

    def _allreduce_interval(self, s: int, t0: float, t1: float) -> None:
        p = self.p
        if t1 <= t0:
            return
        for k in range(len(self.reps)):
            self.out.append((k * p.pp + s, "allreduce", -1, t0, t1, p.grad_bytes[s]))


@contextmanager
def paused_gc():
    """Python's cyclic garbage collector paused for a block that allocates millions of objects that all
    stay alive (a run's tuples and intervals), which it would traverse again and again to free nothing;
    restored as it was found."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def simulate(plan: Plan, turn_block: int | None = None) -> tuple[Timeline, int]:
    """Run one iteration; returns its timeline and the number of events processed. `turn_block`: replicas taking
    turns simulated as one (testbed/sim/aggregate.py; None: 1 up to the full simulation's size)."""
    with paused_gc():
        sim = Simulation(plan, turn_block=turn_block)
        tl = sim.run()
    return tl, sim.events


def simulate_changing(plan: Plan, wan: WanSchedule, t0: float) -> tuple[Timeline, Simulation]:
    """One iteration that starts at t0 on a changing WAN (testbed/sim/linkchange.py); the simulation keeps what
    it saw of the links (`sim.wan`)."""
    with paused_gc():
        sim = Simulation(plan, wan, t0)
        tl = sim.run()
    return tl, sim

"""Online BubbleTea for emulated runs: idle gaps learnt from the live timeline, a plan per iteration.

Workers report each idle gap (between two of their training ops, by its index in their program) as it
ends. The planner predicts each gap from its last `history` iterations (WindowModel): it opens at the
median of its past openings and lasts the median of its past lengths, less a margin measured online (a
quantile, from the median up while training waits, of how much that prediction overestimated the recent
gaps). The opening is only a hint for planning: a worker anchors the predicted length to the gap's live
opening, and starts a job only if it fits what is predicted to remain of the gap less the guard band
(testbed/bubbletea/worker_side.py), since a gap's length varies far less from one iteration to the next than
where it falls.

At the start of every iteration k it re-plans: the requests not yet decided or not yet started (in
arrival order) are placed by the simulator's scheduler (testbed/bubbletea/scheduler.py) into the predicted
windows of iterations k .. k+H (H covers the TTFT SLO), less the jobs of requests already under way. A
request stays on its worker once a job of it has run (all its chunks, in whichever iterations they fall);
one with no place within its SLO goes to the fallback pool, joining its queue at its arrival (or now, if its job
was not run and the re-plan found no other place in time). In the simulator's noisy runs
(testbed/bubbletea/realised.py) jobs keep offsets: a job never starts after its latest start (the
predicted window's end, less the guard band and the job's duration).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median

from testbed.bubbletea.bubbles import Bubble
from testbed.bubbletea.knee import SLOWDOWN_MAX
from testbed.bubbletea.scheduler import GroupCost, schedule
from testbed.bubbletea.trace import Request

Window = tuple[float, float]
MISS_MIN, MISS_MAX = 1 / 64, 1 / 2  # the margin's quantile stays between the median and the 98th percentile


def intersect(a: list[Window], b: list[Window]) -> list[Window]:
    """The time covered by both sorted, disjoint window lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(ws: list[Window], busy: list[Window]) -> list[Window]:
    """The sorted windows `ws` less the (sorted) busy intervals."""
    out = []
    for a, b in ws:
        cur = a
        for x, y in busy:
            if y <= cur or x >= b:
                continue
            if x > cur:
                out.append((cur, x))
            cur = max(cur, y)
        if b > cur:
            out.append((cur, b))
    return out


Gap = tuple[int, float, float]  # (its index in the worker's program: training ops before it, start, end)


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] if xs else 0.0


class WindowModel:
    """Per worker, its idle gaps of the last `history` iterations, each by its index in the worker's program
    (gap g: after the g-th training op; the last one runs to the end of the last training op anywhere).

    A worker runs the same program every iteration, so gap g recurs; what moves is when it opens (every
    delay upstream shifts it) and, much less, how long it lasts. A gap is predicted to open at the median
    of its past openings and to last the median of its past lengths (0 in an iteration without it);
    the worker anchors the length to the gap's live opening (testbed/bubbletea/worker_side.py). `margin_s` is
    the measured shortfall of that prediction: the `MARGIN_QUANTILE` of (predicted - realised length) over
    the gaps of the last `history` iterations long enough to hold a job (the smallest prefill), so a job
    admitted against it fits its real gap with that probability."""

    # Where the planner starts: the median, the narrowest margin (OnlinePlanner.overran widens it while training
    # waits). A job in a gap shorter than predicted pauses within a layer, so it starts narrow and widens on
    # measured cost; starting at the 90th percentile cost a loaded run 3-4 iterations at a 20-40 ms margin.
    MARGIN_QUANTILE = 0.5

    def __init__(self, history: int = 3) -> None:
        self.quantile = self.MARGIN_QUANTILE
        self.seen: dict[str, deque[dict[int, Window]]] = {}
        self.history = history
        self.warmup: set[str] = set()  # workers whose only observation is the warm-up iteration
        self.tails: dict[str, int] = {}  # worker -> its tail gap, where the end is signalled (no margin)
        self.errors: dict[str, deque[list[float]]] = {}  # per worker and recent iteration: predicted - realised
        self.min_gap_s = 0.0  # the shortest gap that can hold a job: only those are scored

    def observe(self, worker: str, windows: list[Gap], warmup: bool = False, tail: int | None = None) -> None:
        """A finished iteration's gaps; the warm-up iteration (connection set-up, slow start) is used
        only until a steady one replaces it. `tail`: the index of the worker's last gap when its end is
        signalled live (the emulated service tells workers when every one is in its tail): it needs no
        margin, and its errors (the largest: it ends with the slowest worker) are not the others'."""
        if tail is not None:
            self.tails[worker] = tail
        if worker in self.warmup:
            self.seen[worker].clear()
            self.warmup.discard(worker)
        gaps = {int(g): (a, b) for g, a, b in windows}
        if not warmup and self.seen.get(worker):  # score the prediction from the steady iterations before
            errs = [length - (gaps[g][1] - gaps[g][0] if g in gaps else 0.0)
                    for g, length in self.lengths(worker).items()
                    if length > self.min_gap_s and g != self.tails.get(worker)]
            self.errors.setdefault(worker, deque(maxlen=self.history)).append(errs)
        if warmup:
            self.warmup.add(worker)
        self.seen.setdefault(worker, deque(maxlen=self.history)).append(gaps)

    @property
    def margin_s(self) -> float:
        return max(0.0, quantile([e for per in self.errors.values() for it in per for e in it], self.quantile))

    def margin_for(self, worker: str, gap: int) -> float:
        return 0.0 if gap == self.tails.get(worker) else self.margin_s

    def lengths(self, worker: str) -> dict[int, float]:
        """Each recurring gap's predicted length (the median of its past lengths, 0 where it was absent)."""
        past = list(self.seen.get(worker, []))
        out = {}
        for g in sorted({g for it in past for g in it}):
            ls = [it[g][1] - it[g][0] if g in it else 0.0 for it in past]
            if median(ls) > 0:
                out[g] = median(ls)
        return out

    def predict_gaps(self, worker: str) -> list[Gap]:
        """(gap, predicted opening, predicted end less the margin), in program order."""
        past = list(self.seen.get(worker, []))
        out, margin = [], self.margin_s
        for g, length in self.lengths(worker).items():
            usable = length - (0.0 if g == self.tails.get(worker) else margin)
            if usable > 0:
                a = median([it[g][0] for it in past if g in it])
                out.append((g, a, a + usable))
        return out

    def predict(self, worker: str) -> list[Window]:
        """The predicted windows as offsets from the iteration's start, sorted and disjoint."""
        merged: list[Window] = []
        for _g, a, b in sorted(self.predict_gaps(worker), key=lambda x: x[1]):
            if merged and a < merged[-1][1]:  # medians of neighbouring gaps may overlap: keep them disjoint
                a = merged[-1][1]
            if b > a:
                merged.append((a, b))
        return merged


@dataclass
class Job:
    """One chunk of one request on one worker: offsets from its iteration's start."""

    request_id: int
    chunk: int
    chunks: int
    iteration: int
    offset_s: float
    duration_s: float
    latest_s: float
    tokens: int
    cached: int
    home_dc: str
    earliest_s: float = 0.0  # its window's predicted opening, less the guard: it may start from there when idle
    arrival_s: float = 0.0  # when its request arrived (timeline clock)
    early: bool = False  # ran in the iteration before its own (handed out as standby)

    def wire(self, start_s: float) -> list:
        """What the emulated worker of the iteration starting at `start_s` (timeline clock) gets: it may start
        the job in any idle gap from the request's arrival on, if the job fits what is predicted to remain of
        that gap (the gaps go with it)."""
        return [self.request_id, self.chunk, self.chunks, max(0.0, self.arrival_s - start_s), self.duration_s,
                self.tokens, self.cached, self.home_dc]


@dataclass
class Decision:
    """What became of a request: served in bubbles on `worker` (its jobs), or the pool (joined at
    `pool_join_s` on the timeline clock)."""

    request: Request
    worker: str = ""
    jobs: list[Job] = field(default_factory=list)
    pool_join_s: float | None = None
    reason: str = ""  # why the pool (testbed/bubbletea/scheduler.py POOL_REASONS)


def pool_reason(placed: bool, planned: str | None) -> str:
    """Why a request that bubbles did not serve went to the pool, as the run ended: placed in bubbles but its jobs
    not all run (not_run), sent there when planned (the planner's reason), or never decided (run_end)."""
    return "not_run" if placed else planned if planned is not None else "run_end"


class OnlinePlanner:
    """The service's brain; times are on the run's timeline clock (iterations back to back)."""

    def __init__(self, requests: list[Request], workers: dict[str, tuple[str, GroupCost]], *,
                 homes: dict[int, str], kv_time: Callable[[str, str, int], float], guard_s: float, slo_s: float,
                 history: int = 3, last_iteration: int | None = None) -> None:
        """`last_iteration`: the run's last (none planned past it: a request no bubble up to it serves goes to
        the pool when planned, not when the run ends)."""
        self.requests = sorted(requests, key=lambda q: (q.arrival_s, q.request_id))
        self.workers = workers  # name -> (dc, costs)
        self.homes, self.kv_time, self.guard_s, self.slo_s = homes, kv_time, guard_s, slo_s
        self.windows = WindowModel(history)
        self.ratios: deque[float] = deque(maxlen=64)  # measured / predicted time of recent jobs
        self.durations: deque[float] = deque(maxlen=history)
        self.warm = False  # the durations hold only the warm-up iteration's
        self.decided: dict[int, Decision] = {}
        self.retry: dict[int, float] = {}  # request id -> not before (a skipped job, a deferral)
        self.skips: set[int] = set()  # requests a job of which a worker skipped
        self.next_request = 0
        self.measured: dict[int, bool] = {}  # iteration -> whether its plan had a measured margin
        self.last_iteration = last_iteration

    def shift(self, by_s: float) -> None:
        """Move every arrival by `by_s` (the requests' clock starts at iteration 1)."""
        self.requests = [Request(q.request_id, q.arrival_s + by_s, q.prompt_tokens, q.output_tokens)
                         for q in self.requests]

    def observe(self, windows: dict[str, list[Gap]], duration_s: float, warmup: bool = False,
                tails: dict[str, int] | None = None) -> None:
        """A finished iteration: each worker's idle gaps (index, start and end offsets) and its length;
        `tails`: each worker's tail gap, where its end is signalled live (WindowModel.observe)."""
        shortest = [c.full(1) for _dc, c in self.workers.values()]
        self.windows.min_gap_s = min(shortest) if shortest else 0.0
        for w, ws in windows.items():
            self.windows.observe(w, ws, warmup, (tails or {}).get(w))
        if warmup or self.warm:
            self.durations.clear()
        self.warm = warmup
        self.durations.append(duration_s)

    def overran(self, waited_s: float, duration_s: float, iteration: int | None = None) -> None:
        """Training waited `waited_s` for prefill in the gaps the margin governs (all workers together; not in
        the tail, which takes no margin and stops when every worker is in it) in an iteration of `duration_s`. The
        share of gaps allowed to be shorter than predicted (1 - the margin's quantile) halves while that wait
        exceeds the slowdown the knee accepts (testbed/bubbletea/knee.py) and doubles while it stays under half
        of it, between 1/64 and 1/2: a misjudged gap costs training at most a layer of prefill, so the margin
        is only as wide as the measured cost of mispredictions requires. `iteration`: the iteration waited in;
        one planned before any margin was measured (the first steady ones) says nothing about the quantile."""
        if not self.windows.errors or (iteration is not None and not self.measured.get(iteration, False)):
            return  # no margin measured (yet, or when its plan was made): the quantile has nothing to act on
        budget = SLOWDOWN_MAX * duration_s
        miss = 1.0 - self.windows.quantile
        if waited_s > budget:
            miss = max(MISS_MIN, miss / 2)
        elif waited_s < budget / 2:
            miss = min(MISS_MAX, miss * 2)
        self.windows.quantile = 1.0 - miss

    def took(self, predicted_s: float, measured_s: float) -> None:
        """A job's busy time as it ran: predictions are scaled by the recent median ratio, so the plan
        learns how long prefill really takes here (contention, a CPU slower than its calibration)."""
        if predicted_s > 0:
            self.ratios.append(measured_s / predicted_s)

    @property
    def slack(self) -> float:
        return min(3.0, max(1.0, median(self.ratios))) if self.ratios else 1.0

    def skipped(self, request_id: int, t_s: float) -> None:
        """A worker skipped a job of this request (its bubble moved): the request is undecided again."""
        d = self.decided.pop(request_id, None)
        if d is not None:
            self.retry[request_id] = t_s
            self.skips.add(request_id)

    def plan(self, k: int, start_s: float) -> dict[str, list[Job]]:
        """Re-plan at the start of iteration k (at `start_s` on the timeline); return the jobs to run in k."""
        if not self.durations:
            return {}
        D = median(self.durations)
        H = max(1, math.ceil(self.slo_s / D) + 1) if D > 0 else 1
        if self.last_iteration is not None:
            H = max(1, min(H, self.last_iteration - k + 1))
        end_k = start_s + D
        self._release(k)
        self.measured[k] = bool(self.windows.errors)
        while self.next_request < len(self.requests) and self.requests[self.next_request].arrival_s < end_k:
            self.next_request += 1
        pending = [q for q in self.requests[:self.next_request] if q.request_id not in self.decided
                   and not self._in_pool(q.request_id)]
        bubbles = self._bubbles(k, start_s, D, H)
        f = self.slack
        costs = {(w, dc): GroupCost(lambda n, c=c: f * c.full(n), lambda d, n, c=c: f * c.chunk(d, n), c.max_tokens)
                 for w, (dc, c) in self.workers.items()}
        since = {q.request_id: q.arrival_s for q in pending}
        moved = [Request(q.request_id, max(q.arrival_s, self.retry.get(q.request_id, q.arrival_s)), q.prompt_tokens,
                         q.output_tokens) for q in pending]
        placed = schedule(moved, bubbles, costs=costs, pool=None, kv_time=self.kv_time,
                          home=lambda q: self.homes[q.request_id], guard_s=self.guard_s, slo_s=self.slo_s,
                          horizon_s=start_s + H * D, since=since)
        for q, pl in zip(pending, placed, strict=True):
            if pl.fallback:
                reason = "skipped" if q.request_id in self.skips and pl.pool_reason == "late" else pl.pool_reason
                self.decided[q.request_id] = Decision(q, pool_join_s=max(pl.request.arrival_s, start_s),
                                                      reason=reason)
                continue
            jobs, done = [], 0
            for n, (a, b, tok) in enumerate(pl.intervals):
                j = k + max(0, int((a - start_s) // D))
                base = start_s + (j - k) * D
                win = next(bb for bb in bubbles if bb.gpu == pl.gpu and bb.start_s <= a + 1e-12
                           and b <= bb.end_s + 1e-12)
                jobs.append(Job(q.request_id, n, len(pl.intervals), j, a - base, b - a,
                                win.end_s - self.guard_s - (b - a) - base, tok, done, pl.home_dc,
                                win.start_s + self.guard_s - base, pl.request.arrival_s))
                done += tok
            self.decided[q.request_id] = Decision(q, pl.gpu, jobs)
        return self.jobs_for(k)

    def _release(self, k: int) -> None:
        """Every request placed in bubbles none of whose jobs has run yet (all in iteration k or later, none run
        early) is placed again, with the newest prediction, in arrival order with the rest: an older request
        (one whose job was skipped) goes before younger ones rather than behind every job already placed,
        where its SLO has often run out. A request with a job run keeps its place (its KV cache is there)."""
        for rid, d in list(self.decided.items()):
            if d.worker and all(j.iteration >= k and not j.early for j in d.jobs):
                del self.decided[rid]

    def gaps_for(self, worker: str) -> list[list]:
        """[gap, usable length]: each recurring gap's predicted length less the measured margin (the worker
        adds the gap's live opening and takes off the guard band)."""
        return [[g, length - m] for g, length in self.windows.lengths(worker).items()
                if length > (m := self.windows.margin_for(worker, g))]

    def ran_early(self, request_id: int, chunk: int) -> None:
        """A worker ran this job, handed out as standby, in the iteration before its own: its time there is free."""
        d = self.decided.get(request_id)
        for j in d.jobs if d is not None else []:
            if j.chunk == chunk:
                j.early = True

    def jobs_after(self, k: int) -> dict[str, list[Job]]:
        """Each worker's jobs planned for the iterations after k, in planned order: a worker runs one in iteration
        k where none of k's own fits (the plan is a prediction: the live gaps often hold more)."""
        out: dict[str, list[Job]] = {}
        for d in self.decided.values():
            for j in d.jobs:
                if j.iteration > k and not j.early:
                    out.setdefault(d.worker, []).append(j)
        for js in out.values():
            js.sort(key=lambda j: (j.iteration, j.offset_s))
        return out

    def jobs_for(self, k: int) -> dict[str, list[Job]]:
        out: dict[str, list[Job]] = {}
        for d in self.decided.values():
            for j in d.jobs:
                if j.iteration == k and not j.early:
                    out.setdefault(d.worker, []).append(j)
        for js in out.values():
            js.sort(key=lambda j: j.offset_s)
        return out

    def _in_pool(self, rid: int) -> bool:
        d = self.decided.get(rid)
        return d is not None and d.pool_join_s is not None

    def _bubbles(self, k: int, start_s: float, D: float, H: int) -> list[Bubble]:
        """Predicted windows of iterations k .. k+H-1 on the timeline, less committed jobs."""
        busy: dict[str, list[Window]] = {}
        for d in self.decided.values():
            for j in d.jobs:
                if j.iteration >= k and not j.early:
                    a = start_s + (j.iteration - k) * D + j.offset_s
                    busy.setdefault(d.worker, []).append((a, a + j.duration_s))
        out = []
        for w, (dc, _c) in sorted(self.workers.items()):
            s, r = (int(x) for x in w[1:].split("r"))
            predicted = self.windows.predict(w)
            for h in range(H):
                base = start_s + h * D
                ws = [(base + a, base + min(b, D)) for a, b in predicted if a < D]
                for a, b in subtract(ws, sorted(busy.get(w, []))):
                    out.append(Bubble(w, dc, s, r, k + h, a, b))
        return out

"""Online BubbleTea for emulated runs: idle windows learnt from the live timeline, a plan per iteration.

Workers report each idle window (a gap between their training ops) as it ends. The planner predicts
a worker's next windows from its last `history` iterations (offsets from the iteration's start): a
window of the latest iteration is kept only if every one of them had a window overlapping it, and
it is predicted to open at the earliest start seen and to close at the earliest end seen. The end is
what protects training (a job never starts later than the predicted end less the guard and its
duration); the start is only a hint, since a worker runs a job only while it really is idle.

At the start of every iteration k it re-plans: the requests not yet decided (in arrival order) are
placed by the simulator's scheduler (testbed/bubbletea/scheduler.py) into the predicted windows of
iterations k .. k+H (H covers the TTFT SLO), less what is already committed. A placed request is
committed (all its chunks, on one worker, in whichever of those iterations they fall); one with no
place within its SLO goes to the fallback pool, joining its queue at its arrival (or now, if its job
was skipped and the re-plan found no other place in time). Jobs carry
their latest start (the predicted window's end, less the guard band and the job's duration): a worker
never starts one after it (testbed/runtime/prefill.py).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median

from testbed.bubbletea.bubbles import Bubble
from testbed.bubbletea.scheduler import GroupCost, schedule
from testbed.bubbletea.trace import Request

Window = tuple[float, float]


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


class WindowModel:
    """Per worker, the idle windows of its last `history` iterations (offsets from their starts)."""

    def __init__(self, history: int = 3) -> None:
        self.seen: dict[str, deque[list[Window]]] = {}
        self.history = history
        self.warmup: set[str] = set()  # workers whose only observation is the warm-up iteration

    def observe(self, worker: str, windows: list[Window], warmup: bool = False) -> None:
        """A finished iteration's windows; the warm-up iteration (connection set-up, slow start) is used
        only until a steady one replaces it."""
        if worker in self.warmup:
            self.seen[worker].clear()
            self.warmup.discard(worker)
        if warmup:
            self.warmup.add(worker)
        self.seen.setdefault(worker, deque(maxlen=self.history)).append(sorted(windows))

    def predict(self, worker: str) -> list[Window]:
        past = list(self.seen.get(worker, []))
        if not past:
            return []
        out = []
        for a, b in past[-1]:
            starts, ends = [a], [b]
            for ws in past[:-1]:
                hit = [(x, y) for x, y in ws if x < b and y > a]
                if not hit:
                    break
                starts.append(min(x for x, _ in hit))
                ends.append(min(y for _, y in hit))
            else:
                out.append((min(starts), min(ends)))
        merged: list[Window] = []
        for a, b in sorted(out):  # predictions of neighbouring windows may overlap: keep them disjoint
            if merged and a < merged[-1][1]:
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

    def wire(self) -> list:
        """What the worker gets: it may start the job, when idle, from `earliest_s` until `latest_s`."""
        return [self.request_id, self.chunk, self.chunks, min(self.earliest_s, self.offset_s), self.duration_s,
                self.latest_s, self.tokens, self.cached, self.home_dc]


@dataclass
class Decision:
    """What became of a request: served in bubbles on `worker` (its jobs), or the pool (joined at
    `pool_join_s` on the timeline clock)."""

    request: Request
    worker: str = ""
    jobs: list[Job] = field(default_factory=list)
    pool_join_s: float | None = None


class OnlinePlanner:
    """The service's brain; times are on the run's timeline clock (iterations back to back)."""

    def __init__(self, requests: list[Request], workers: dict[str, tuple[str, GroupCost]], *,
                 homes: dict[int, str], kv_time: Callable[[str, str, int], float], guard_s: float, slo_s: float,
                 history: int = 3) -> None:
        self.requests = sorted(requests, key=lambda q: (q.arrival_s, q.request_id))
        self.workers = workers  # name -> (dc, costs)
        self.homes, self.kv_time, self.guard_s, self.slo_s = homes, kv_time, guard_s, slo_s
        self.windows = WindowModel(history)
        self.ratios: deque[float] = deque(maxlen=64)  # measured / predicted time of recent jobs
        self.durations: deque[float] = deque(maxlen=history)
        self.warm = False  # the durations hold only the warm-up iteration's
        self.decided: dict[int, Decision] = {}
        self.retry: dict[int, float] = {}  # request id -> not before (a skipped job, a deferral)
        self.next_request = 0

    def shift(self, by_s: float) -> None:
        """Move every arrival by `by_s` (the requests' clock starts at iteration 1)."""
        self.requests = [Request(q.request_id, q.arrival_s + by_s, q.prompt_tokens, q.output_tokens)
                         for q in self.requests]

    def observe(self, windows: dict[str, list[Window]], duration_s: float, warmup: bool = False) -> None:
        """A finished iteration: each worker's idle windows (offsets) and the iteration's length."""
        for w, ws in windows.items():
            self.windows.observe(w, ws, warmup)
        if warmup or self.warm:
            self.durations.clear()
        self.warm = warmup
        self.durations.append(duration_s)

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

    def plan(self, k: int, start_s: float) -> dict[str, list[Job]]:
        """Re-plan at the start of iteration k (at `start_s` on the timeline); return the jobs to run in k."""
        if not self.durations:
            return {}
        D = median(self.durations)
        H = max(1, math.ceil(self.slo_s / D) + 1) if D > 0 else 1
        end_k = start_s + D
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
                self.decided[q.request_id] = Decision(q, pool_join_s=max(pl.request.arrival_s, start_s))
                continue
            jobs, done = [], 0
            for n, (a, b, tok) in enumerate(pl.intervals):
                j = k + max(0, int((a - start_s) // D))
                base = start_s + (j - k) * D
                win = next(bb for bb in bubbles if bb.gpu == pl.gpu and bb.start_s <= a + 1e-12
                           and b <= bb.end_s + 1e-12)
                jobs.append(Job(q.request_id, n, len(pl.intervals), j, a - base, b - a,
                                win.end_s - self.guard_s - (b - a) - base, tok, done, pl.home_dc,
                                win.start_s + self.guard_s - base))
                done += tok
            self.decided[q.request_id] = Decision(q, pl.gpu, jobs)
        return self.jobs_for(k)

    def jobs_for(self, k: int) -> dict[str, list[Job]]:
        out: dict[str, list[Job]] = {}
        for d in self.decided.values():
            for j in d.jobs:
                if j.iteration == k:
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
                if j.iteration >= k:
                    a = start_s + (j.iteration - k) * D + j.offset_s
                    busy.setdefault(d.worker, []).append((a, a + j.duration_s))
        out = []
        for w, (dc, _c) in sorted(self.workers.items()):
            s, r = (int(x) for x in w[1:].split("r"))
            for h in range(H):
                base = start_s + h * D
                ws = [(base + a, base + min(b, D)) for a, b in self.windows.predict(w) if a < D]
                for a, b in subtract(ws, sorted(busy.get(w, []))):
                    out.append(Bubble(w, dc, s, r, k + h, a, b))
        return out

"""The one timeline type shared by the simulator and the emulator, with CSV and Chrome-trace export.

An interval is one thing a GPU group (the tp GPUs of one stage of one replica) did: compute
(fwd, bwd), communication (send, recv, allreduce), the optimizer step, idle (a bubble), prefill
(BubbleTea) or fill work (BubbleTea's jobs without a latency SLO).
"""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from testbed.results import fmt, write_csv, write_json


class Plan(Protocol):
    """What a simulated timeline reads of its plan (testbed/plan/plan.py Plan has it): the timeline sits below the
    plan in the layers, so it names the fields instead of importing the type."""

    run_id: str
    pp: int
    dp: int
    stage_dc: list[list[str]]  # [replica][stage] -> DC
    optimizer_s: list[list[float]]  # [replica][stage] -> seconds
    diloco: Any  # None, or the sync period's settings (its programs hold their own optimizer steps)

COMPUTE = ("fwd", "bwd")
BUSY = ("fwd", "bwd", "allreduce", "optimizer", "prefill", "fill")  # what occupies the GPU; the rest is idle
HEADER = ("run_id", "source", "iteration", "gpu", "dc", "stage", "replica", "kind", "microbatch",
          "start_s", "end_s", "bytes")


class Interval(NamedTuple):
    iteration: int
    gpu: str
    dc: str
    stage: int
    replica: int
    kind: str
    microbatch: int
    start_s: float
    end_s: float
    bytes: float

    @property
    def dur(self) -> float:
        return self.end_s - self.start_s


def group_name(stage: int, replica: int) -> str:
    return f"s{stage}r{replica}"


def idle_gaps(busy: list[tuple[float, float]], t0: float, t1: float) -> list[tuple[float, float]]:
    """Gaps in [t0, t1] not covered by any busy interval."""
    gaps, cur = [], t0
    for a, b in sorted(busy):
        if a > cur + 1e-12:
            gaps.append((cur, a))
        cur = max(cur, b)
    if t1 > cur + 1e-12:
        gaps.append((cur, t1))
    return gaps


def group_gaps(intervals: list[Interval], iteration_s: list[float], busy_kinds: tuple[str, ...] = BUSY
               ) -> list[Interval]:
    """Idle intervals per (iteration, stage, replica): the gaps between `busy_kinds` in each iteration."""
    starts = [sum(iteration_s[:k]) for k in range(len(iteration_s))]
    busy: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    where: dict[tuple, tuple[str, str]] = {}
    for iv in intervals:
        key = (iv.iteration, iv.stage, iv.replica)
        where[key] = (iv.gpu, iv.dc)
        if iv.kind in busy_kinds:
            busy[key].append((iv.start_s, iv.end_s))
    out = []
    for key in sorted(where):
        it, s, r = key
        gpu, dc = where[key]
        for a, b in idle_gaps(busy[key], starts[it], starts[it] + iteration_s[it]):
            out.append(Interval(it, gpu, dc, s, r, "idle", -1, a, b, 0.0))
    return out


def optimizer_steps(plan: Plan, raw: list[tuple], reps: list[int]) -> list[tuple]:
    """Each group's optimizer step (`plan.optimizer_s`), right after its last compute, all-reduce or reduce-scatter.
    Nothing else in the iteration waits on it, so adding it after the event loop is exact. Raw group
    indices are k * pp + stage for replica reps[k]."""
    if not plan.optimizer_s or plan.diloco is not None:  # a sync period's program has its optimizer steps
        return []
    last: dict[int, float] = {}
    before = ("fwd", "bwd", "allreduce", "reduce_scatter")  # the optimizer steps on the reduced gradients
    for g, _kind, _mb, _t0, t1, _b in [x for x in raw if x[1] in before]:  # filtered first: 3x faster
        if t1 > last.get(g, -1.0):
            last[g] = t1
    out = []
    for g in sorted(last):
        k, s = divmod(g, plan.pp)
        opt = plan.optimizer_s[reps[k]][s]
        if opt > 0:
            out.append((g, "optimizer", -1, last[g], last[g] + opt, 0.0))
    return out


class Timeline:
    """One run's intervals, iteration by iteration.

    A simulated timeline may be computed for one replica of each symmetric class only (`copies`:
    replica -> the replicas it stands for). `intervals` writes the copies out (every replica, as if each
    had been simulated); metrics and `only_replicas` work from the representatives without that cost.
    The simulator's intervals are built lazily: metrics need only their durations.
    """

    def __init__(self, run_id: str, source: str, intervals: list[Interval] | None, iteration_s: list[float],
                 groups: int, copies: dict[int, list[int]] | None = None, raw=None) -> None:
        self.run_id = run_id
        self.source = source  # "sim" | "emu"
        self._reps = intervals  # the representatives' intervals (every replica's when copies is None)
        self._raw = raw  # (plan, reps, executor tuples): representatives' intervals not built yet
        self._all: list[Interval] | None = None
        self._times: tuple[dict[str, list[float]], float] | None = None  # _raw_times, once computed
        self.iteration_s = iteration_s  # duration of each iteration
        self.groups = groups  # GPU groups (each tp GPUs), all replicas counted
        self.copies = copies if copies and any(len(c) > 1 for c in copies.values()) else None

    def rep_intervals(self) -> list[Interval]:
        """The intervals of the simulated replicas only (one per symmetric class)."""
        if self._reps is None:
            self._reps = self._built(None)
            self._raw = None
        return self._reps

    def _built(self, replicas: set[int] | None) -> list[Interval]:
        """Intervals (idle ones included) of the simulated replicas in `replicas` (None: all) from the
        executor's tuples, sorted. Each group's gaps depend on its own intervals only, so a subset comes
        out as the same subsequence of the whole."""
        plan, reps, raw = self._raw
        P = plan.pp
        keep = None if replicas is None else {k for k, r in enumerate(reps) if r in replicas}
        ivs = []
        for g, kind, mb, t0, t1, nbytes in raw:
            k, st = divmod(g, P)
            if keep is not None and k not in keep:
                continue
            r = reps[k]
            ivs.append(Interval(0, group_name(st, r), plan.stage_dc[r][st], st, r, kind, mb, t0, t1, nbytes))
        return sort_intervals(ivs + group_gaps(ivs, [self.iteration_s[0]]))

    @property
    def intervals(self) -> list[Interval]:
        """Every replica's intervals (symmetric copies take their representative's times)."""
        if self.copies is None:
            return self.rep_intervals()
        if self._all is None:
            self._all = self._copied(lambda c: True)
        return self._all

    @intervals.setter
    def intervals(self, ivs: list[Interval]) -> None:
        self._reps, self._raw, self._all, self.copies = ivs, None, None, None

    def _copied(self, keep) -> list[Interval]:
        """Copies in place of their representative; a stable sort keeps each group's own order."""
        copies = self.copies or {}
        if self._reps is None:  # build only the representatives of the copies kept
            reps = self._raw[1]
            base = self._built({r for r in reps if any(keep(c) for c in copies.get(r, [r]))})
        else:
            base = self._reps
        kept: dict[int, list[int]] = {}  # representative -> its copies kept: `keep` once per copy, not per interval
        names: dict[tuple[int, int], str] = {}  # (stage, copy) -> its group's name
        for iv in base:
            if iv.replica not in kept:
                kept[iv.replica] = [c for c in copies.get(iv.replica, [iv.replica]) if keep(c)]
            for c in kept[iv.replica]:
                names.setdefault((iv.stage, c), group_name(iv.stage, c))
        ivs = [Interval(it, names[(st, c)], dc, st, c, kind, mb, t0, t1, nbytes) if c != r else iv  # not _replace
               for iv in base for it, _, dc, st, r, kind, mb, t0, t1, nbytes in (iv,) for c in kept[r]]
        return sorted(ivs, key=lambda iv: (iv.iteration, iv.stage, iv.replica))

    @classmethod
    def from_sim(cls, plan: Plan, raw: list[tuple], reps: list[int] | None = None,
                 copies: dict[int, list[int]] | None = None) -> Timeline:
        """Iteration 0 from the executor's raw tuples (group index k * pp + stage for replica reps[k]), with
        each group's optimizer step."""
        reps = reps or list(range(plan.dp))
        raw = raw + optimizer_steps(plan, raw, reps)
        end = max(map(itemgetter(4), raw), default=0.0)
        return cls(plan.run_id, "sim", None, [end], plan.pp * plan.dp, copies, (plan, reps, raw))

    def weight(self, replica: int) -> int:
        return len(self.copies[replica]) if self.copies else 1

    def busy_time(self, kinds: tuple[str, ...]) -> float:
        """GPU-group seconds spent in `kinds`, over all iterations and every replica."""
        if self._raw is not None:
            if kinds == ("idle",):
                return self._raw_times()[1]
            if "idle" not in kinds:
                # exactly rounded, so the order in which the executor produced the tuples does not matter
                if all(k in BUSY for k in kinds):
                    per_kind = self._raw_times()[0]
                    return math.fsum(x for k in kinds for x in per_kind[k])
                plan, reps, raw = self._raw
                w = [self.weight(r) for r in reps]
                return math.fsum((t1 - t0) * w[g // plan.pp] for g, kind, _mb, t0, t1, _b in raw if kind in kinds)
        if self.copies is None:  # every weight 1, and x * 1 == x: the same sum without the lookups
            return sum(iv.end_s - iv.start_s for iv in self.rep_intervals() if iv.kind in kinds)
        return sum(iv.dur * self.weight(iv.replica) for iv in self.rep_intervals() if iv.kind in kinds)

    def _raw_times(self) -> tuple[dict[str, list[float]], float]:
        """From the executor's tuples, without building intervals: the weighted durations of each busy kind
        (BUSY), and the idle time as busy_time(("idle",)) computes it from the intervals (the same gaps as
        group_gaps, summed in the same order: by stage, replica, then time)."""
        if self._times is None:
            plan, reps, raw = self._raw
            P = plan.pp
            w = [self.weight(r) for r in reps for _ in range(P)]  # by group
            busy_kinds = frozenset(BUSY)
            rows = sorted((x for x in raw if x[1] in busy_kinds), key=itemgetter(0))  # stable: each group in order
            per_kind: dict[str, list[float]] = {k: [] for k in BUSY}
            for g, kind, _mb, t0, t1, _b in rows:
                per_kind[kind].append((t1 - t0) * w[g])
            span = itemgetter(3, 4)  # (start, end)
            busy = {g: list(map(span, ivs)) for g, ivs in groupby(rows, key=itemgetter(0))}
            if len(busy) < len(w):  # a group with intervals but none busy still has its gaps (group_gaps)
                for g in set(map(itemgetter(0), raw)) - busy.keys():
                    busy[g] = []
            order = sorted(busy, key=lambda g: (g % P, reps[g // P]))
            T = self.iteration_s[0]
            idle = sum((b - a) * w[g] for g in order for a, b in idle_gaps(busy[g], 0.0, T))
            self._times = (per_kind, idle)
        return self._times

    def repeated(self, iterations: int) -> Timeline:
        """Iterations are separated by a synchronous optimizer step, so in the simulator each one is
        the first shifted by its start time."""
        if iterations == 1:
            return self
        T = self.iteration_s[0]
        ivs = [Interval(k, gpu, dc, st, r, kind, mb, t0 + k * T, t1 + k * T, nbytes)  # not _replace: 3x faster
               for k in range(iterations) for _, gpu, dc, st, r, kind, mb, t0, t1, nbytes in self.rep_intervals()]
        return Timeline(self.run_id, self.source, ivs, [T] * iterations, self.groups, self.copies)

    @classmethod
    def joined(cls, parts: list[Timeline]) -> Timeline:
        """One-iteration timelines run back to back (a WAN that changes makes every iteration its own)."""
        ivs, t = [], 0.0
        for k, part in enumerate(parts):
            ivs += [iv._replace(iteration=k, start_s=iv.start_s + t, end_s=iv.end_s + t) for iv in part.intervals]
            t += part.iteration_s[0]
        first = parts[0]
        return Timeline(first.run_id, first.source, ivs, [p.iteration_s[0] for p in parts], first.groups)

    def steady(self) -> Timeline:
        """Without iteration 0 (connection set-up, TCP slow start) when there is more than one."""
        if len(self.iteration_s) < 2:
            return self
        return Timeline(self.run_id, self.source, [iv for iv in self.rep_intervals() if iv.iteration > 0],
                        self.iteration_s[1:], self.groups, self.copies)

    def only_replicas(self, n: int) -> Timeline:
        """The same timeline restricted to replicas < n (metrics are computed before this)."""
        return Timeline(self.run_id, self.source, self._copied(lambda c: c < n), self.iteration_s, self.groups)

    def with_busy(self, extra: list[Interval]) -> Timeline:
        """Add busy intervals (e.g. prefill) and recompute the idle ones around them."""
        ivs = [iv for iv in self.intervals if iv.kind != "idle"] + extra
        return Timeline(self.run_id, self.source, sort_intervals(ivs + group_gaps(ivs, self.iteration_s)),
                        self.iteration_s, self.groups)

    def rows(self):
        for iv in self.intervals:
            yield (self.run_id, self.source, iv.iteration, iv.gpu, iv.dc, iv.stage, iv.replica, iv.kind,
                   iv.microbatch, fmt(iv.start_s, 9), fmt(iv.end_s, 9), int(round(iv.bytes)))


def sort_intervals(ivs: list[Interval]) -> list[Interval]:
    return sorted(ivs, key=lambda iv: (iv.iteration, iv.stage, iv.replica, iv.start_s, iv.end_s, iv.kind,
                                       iv.microbatch))


def write_timelines(path: str | Path, timelines: list[Timeline]) -> None:
    write_csv(path, HEADER, (row for tl in timelines for row in tl.rows()))


def chrome_trace(timelines: list[Timeline]) -> dict:
    """Chrome trace-event JSON (opens in Perfetto): one process per run and DC, one thread per group."""
    events: list[dict] = []
    pids: dict[tuple[str, str], int] = {}
    for tl in timelines:
        for iv in tl.intervals:
            if iv.kind == "idle":
                continue
            key = (tl.run_id, iv.dc)
            if key not in pids:
                pids[key] = len(pids) + 1
                events.append({"ph": "M", "name": "process_name", "pid": pids[key], "tid": 0,
                               "args": {"name": f"{tl.run_id} [{tl.source}] {iv.dc}"}})
            name = iv.kind if iv.microbatch < 0 else f"{iv.kind} mb{iv.microbatch}"
            events.append({"ph": "X", "name": name, "cat": iv.kind, "pid": pids[key],
                           "tid": iv.stage * 100000 + iv.replica,
                           "ts": round(iv.start_s * 1e6, 3), "dur": round(iv.dur * 1e6, 3),
                           "args": {"gpu": iv.gpu, "iteration": iv.iteration, "bytes": int(iv.bytes)}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: str | Path, timelines: list[Timeline]) -> None:
    write_json(path, chrome_trace(timelines))

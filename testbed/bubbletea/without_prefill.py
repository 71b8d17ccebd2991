"""Training's slowdown from prefill, measured inside one run: each iteration replayed from its own timeline with
training's waits for prefill taken out.

Comparing a BubbleTea run with a separate run of training alone mixes prefill's effect with the difference
between two runs, which on a shared 2-vCPU machine is a few percent (docs/bubbletea.md), more than the 1 % the
knee allows. Here the comparison is paired: the same iterations, the same transfers, the same compute times.
Walking each group's lowered program (testbed/program.py) over its intervals, every training op starts in the
replay when it was ready (its group free, its inputs in) plus the delay it had in the run that prefill does not
explain (the part of the wait before it that no prefill interval covers); a message arrives its transfer time
after the replayed send; an all-reduce ends its measured time after its last member's replayed entry. The
iteration without prefill ends at the last training interval; with prefill it ends where the run's did (a
prefill in the drain included).

What it cannot see: a transfer that took longer because of prefill (a KV cache on the same link, the CPU prefill
takes from the emulation, a send moved by a wait that changed how replicas shared a link), which shows only in the
comparison with a separate run: there the replay reads low (bench/paired_slowdown.py measures by how much on the
simulator's realised runs). Both engines' timelines have this shape (a recv from the sender's send to the arrival,
a send from its start), so it applies to the simulator's realised iterations as well, where the same noise
without prefill is known and checks it (tests/test_without_prefill.py).
"""

from __future__ import annotations

from collections import defaultdict
from statistics import quantiles

from testbed.program import AllReduce, Backward, Forward, Program, Recv, Send
from testbed.timeline import Interval, Timeline

TRAINING = ("fwd", "bwd", "send", "recv", "allreduce", "optimizer")
EPS = 1e-9


class ReplayError(ValueError):
    """The timeline does not hold what the programs say (a group's op missing, a message without its send)."""


def _overlap(spans: list[tuple[float, float]], a: float, b: float) -> float:
    return sum(max(0.0, min(b, e) - max(a, s)) for s, e in spans)


class _Group:
    """One group's walk through its program in one iteration: the run's times (a_*) and the replay's (c_*)."""

    def __init__(self, prog: Program, ivs: list[Interval], go: float) -> None:
        self.prog = prog
        self.i = 0
        self.a_prev = self.c_prev = go + prog.offset_s
        self.arrivals: list[tuple[float, float]] = []  # (run, replay) arrival times of the messages the next op needs
        self.entry: tuple[float, float] | None = None  # an all-reduce's start, run and replay, once reached
        by = defaultdict(list)
        for iv in ivs:
            by[iv.kind].append(iv)
        self.prefill = [(iv.start_s, iv.end_s) for iv in by["prefill"]]
        self.compute = {(k, iv.microbatch): iv for k in ("fwd", "bwd") for iv in by[k]}
        self.sends = sorted(by["send"], key=lambda iv: iv.start_s)  # enqueued in program order
        self.recvs = by["recv"]
        self.allreduce = by["allreduce"]
        self.optimizer = by["optimizer"]
        self.n_sends = 0
        self.send_shift: dict[tuple[int, float], float] = {}  # (microbatch, start) -> replay - run
        self.ends: list[tuple[float, float]] = []  # (run, replay) ends of its training intervals

    def _start(self, iv: Interval) -> float:
        """The replayed start of a training op: ready in the replay, plus the run's delay past readiness that no
        prefill interval covers."""
        ready_a = max([self.a_prev, *(a for a, _ in self.arrivals)])
        ready_c = max([self.c_prev, *(c for _, c in self.arrivals)])
        extra = max(0.0, iv.start_s - ready_a)
        return ready_c + max(0.0, extra - _overlap(self.prefill, ready_a, iv.start_s))

    def _done(self, iv: Interval, c_end: float) -> None:
        self.a_prev, self.c_prev = iv.end_s, c_end
        self.arrivals = []
        self.ends.append((iv.end_s, c_end))

    def _one(self, kind: str, found: list[Interval]) -> Interval:
        if len(found) != 1:
            raise ReplayError(f"{self.prog.group}: {len(found)} {kind} intervals in one iteration, expected 1")
        return found[0]

    def advance(self, groups: dict[str, _Group]) -> bool:
        """Walk as far as the other groups' replay allows; True when the program is done."""
        steps = self.prog.steps
        while self.i < len(steps):
            st = steps[self.i]
            if isinstance(st, Recv):
                peer = groups.get(st.peer)
                if peer is None:
                    raise ReplayError(f"{self.prog.group}: no intervals of its peer {st.peer}")
                got = self._match(st, peer)
                if got is None:
                    return False  # the peer's replay has not sent it yet
                self.arrivals.append(got)
            elif isinstance(st, Send):
                if self.n_sends >= len(self.sends):
                    raise ReplayError(f"{self.prog.group}: fewer send intervals than Send steps")
                iv = self.sends[self.n_sends]
                self.n_sends += 1
                shift = self.c_prev - self.a_prev
                self.send_shift[(iv.microbatch, iv.start_s)] = shift
                self.ends.append((iv.end_s, iv.end_s + shift))
            elif isinstance(st, (Forward, Backward)):
                key = ("fwd" if isinstance(st, Forward) else "bwd", st.microbatch)
                iv = self.compute.get(key)
                if iv is None:
                    raise ReplayError(f"{self.prog.group}: no {key[0]} interval of microbatch {st.microbatch}")
                c0 = self._start(iv)
                self._done(iv, c0 + iv.dur)
            elif isinstance(st, AllReduce):
                iv = self._one("allreduce", self.allreduce)
                if self.entry is None:
                    self.entry = (iv.start_s, self._start(iv))
                members = [g for ring in st.rings for g in ring]
                entries = [groups[g].entry if g in groups else None for g in members]
                if any(e is None for e in entries):
                    return False  # the ring ends after its last member joins
                last_a = max(e[0] for e in entries)  # type: ignore[index]
                last_c = max(e[1] for e in entries)  # type: ignore[index]
                self._done(iv, max(self.entry[1], iv.end_s - (last_a - last_c)))
            self.i += 1
        if self.optimizer and self.i == len(steps):
            iv = self._one("optimizer", self.optimizer)
            c0 = self._start(iv)
            self._done(iv, c0 + iv.dur)
            self.i += 1
        return True

    def _match(self, st: Recv, peer: _Group) -> tuple[float, float] | None:
        """The (run, replay) arrival of `st`'s message: the recv interval of this microbatch that began at one of
        the peer's sends (a recv runs from the sender's send to the arrival), once the peer's replay sent it."""
        for iv in self.recvs:
            if iv.microbatch != st.microbatch:
                continue
            for (mb, start), shift in peer.send_shift.items():
                if mb == st.microbatch and abs(start - iv.start_s) <= EPS:
                    return iv.end_s, iv.end_s + shift
        if not any(iv.microbatch == st.microbatch and abs(s.start_s - iv.start_s) <= EPS
                   for iv in self.recvs for s in peer.sends):
            raise ReplayError(f"{self.prog.group}: no recv interval of microbatch {st.microbatch} from {st.peer}")
        return None


def iteration_without_prefill(programs: dict[str, Program], ivs: list[Interval], go: float) -> float:
    """Seconds from `go` (the iteration's start on the timeline's clock) to the end of its training replayed
    without its waits for prefill."""
    by_group: dict[str, list[Interval]] = defaultdict(list)
    for iv in ivs:
        if iv.kind in TRAINING or iv.kind == "prefill":
            by_group[iv.gpu].append(iv)
    groups = {g: _Group(programs[g], by_group[g], go) for g in by_group if g in programs}
    if not groups:
        raise ReplayError("no training intervals in this iteration")
    left = set(groups)
    while left:
        before = [(groups[g].i, groups[g].entry) for g in sorted(left)]
        left -= {g for g in left if groups[g].advance(groups)}
        if left and [(groups[g].i, groups[g].entry) for g in sorted(left)] == before:
            stuck = sorted(left)[0]
            raise ReplayError(f"{stuck}: its replay waits on a step no group reaches (step {groups[stuck].i})")
    return max(c for g in groups.values() for _, c in g.ends) - go


def paired_slowdowns(programs: dict[str, Program], timeline: Timeline, first: int = 1) -> list[float]:
    """Per iteration from `first` on: the run's iteration time over the same iteration without prefill's waits,
    minus 1."""
    its: dict[int, list[Interval]] = defaultdict(list)
    for iv in timeline.intervals:
        its[iv.iteration].append(iv)
    out = []
    go = 0.0
    for k, dur in enumerate(timeline.iteration_s):
        if k >= first and its.get(k):
            out.append(dur / iteration_without_prefill(programs, its[k], go) - 1)
        go += dur
    return out


def summary(rel: list[float]) -> tuple[float, float, float]:
    """Median, 25th and 75th percentile (inclusive: linear between the values) of the per-iteration slowdowns."""
    if len(rel) == 1:
        return rel[0], rel[0], rel[0]
    p25, p50, p75 = quantiles(rel, n=4, method="inclusive")
    return p50, p25, p75

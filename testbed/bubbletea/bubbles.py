"""Bubbles: the idle intervals of each GPU group, from any timeline (simulated or emulated)."""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import NamedTuple

from testbed.results import fmt, write_csv
from testbed.timeline import BUSY, Timeline, group_gaps


class Bubble(NamedTuple):
    gpu: str
    dc: str
    stage: int
    replica: int
    iteration: int
    start_s: float
    end_s: float

    @property
    def dur(self) -> float:
        return self.end_s - self.start_s


def extract_bubbles(tl: Timeline, *, skip_first: bool = False, min_s: float = 0.0) -> list[Bubble]:
    """Idle gaps between busy intervals (compute, all-reduce, prefill) per group and iteration.
    `skip_first` drops iteration 0 (warm-up) for emulated runs to keep the steady state."""
    training = tuple(k for k in BUSY if k not in ("prefill", "fill"))  # bubbles of training, filled or not
    skip = skip_first and len(tl.iteration_s) > 1
    return [Bubble(g.gpu, g.dc, g.stage, g.replica, g.iteration, g.start_s, g.end_s)
            for g in group_gaps(tl.intervals, tl.iteration_s, training)
            if g.dur > min_s and not (skip and g.iteration == 0)]


def bubble_stats(bubbles: list[Bubble], tl: Timeline) -> dict[str, float]:
    durs = sorted(b.dur for b in bubbles)
    total = sum(durs)
    gpu_time = sum(tl.iteration_s) * tl.groups
    return {"bubbles": len(durs), "bubble_s": total, "bubble_share": total / gpu_time if gpu_time else 0.0,
            "bubble_p50_ms": median(durs) * 1e3 if durs else 0.0,
            "bubble_p90_ms": durs[int(0.9 * (len(durs) - 1))] * 1e3 if durs else 0.0,
            "bubble_max_ms": durs[-1] * 1e3 if durs else 0.0}


BUBBLES_HEADER = ("run_id", "source", "gpu", "dc", "stage", "replica", "iteration", "start_s", "end_s", "dur_s")


def bubble_rows(run_id: str, source: str, bubbles: list[Bubble]):
    for b in bubbles:
        yield (run_id, source, b.gpu, b.dc, b.stage, b.replica, b.iteration, fmt(b.start_s, 9), fmt(b.end_s, 9),
               fmt(b.dur, 9))


def write_bubbles(path: str | Path, runs: list[tuple[str, str, list[Bubble]]]) -> None:
    write_csv(path, BUBBLES_HEADER, (row for rid, src, bs in runs for row in bubble_rows(rid, src, bs)))

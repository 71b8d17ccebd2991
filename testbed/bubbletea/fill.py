"""Fill work: a second class of bubble work without a latency SLO (PipeFill-style batch inference, evaluation,
embedding). It takes only the idle time training and SLO-bound prefill leave, so neither waits for it.

A job is `passes` forward passes of the fill model over `batch` sequences of `seq_len` tokens, due
`deadline_s` after it arrives. A pass runs on one GPU group (its activations stay there) layer by layer; a
layer is the unit of preemption, as for prefill: a layer starts only where it ends before the window
does, so a pass left unfinished when a window closes goes on in its group's next window. Windows are the
gaps of the realised timeline (training and prefill busy) shrunk by the guard band at both ends.

Policy: earliest deadline first among the jobs that have arrived; a job is given up when a pass of it would no
longer end by its deadline (its passes already started run to their end); a group finishes the pass it holds
before it takes another. A layer costs the prefill cost model's pass time over the layers
(testbed/costs/prefill_model.py, the one BubbleTea's prefill uses), so the fill's costs are the compute model's,
not constants of this module.
"""

from __future__ import annotations

import csv
import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testbed.costs.gpus import GPUS
from testbed.costs.prefill import inference_model, kv_bytes_per_token, pass_work, weights_gb
from testbed.costs.prefill_model import DEFAULT_PREFILL_MODEL, prefill_time_s
from testbed.errors import SpecError
from testbed.plan.plan import Plan
from testbed.spec.experiment import FillOptions
from testbed.timeline import BUSY, Interval, Timeline, group_gaps

TRACE_COLUMNS = ("arrival_s", "batch", "seq_len", "passes", "deadline_s")


@dataclass(frozen=True)
class FillJob:
    job_id: int
    arrival_s: float
    batch: int
    seq_len: int
    passes: int
    deadline_s: float  # on the run's clock

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len * self.passes


def generated_jobs(opts: FillOptions, horizon_s: float, seed: int) -> list[FillJob]:
    """Poisson arrivals at `jobs_per_s` over the run, every job of the options' shape (seeded)."""
    rng = random.Random(f"fill:{seed}")
    out: list[FillJob] = []
    t = rng.expovariate(opts.jobs_per_s)
    while t < horizon_s:
        out.append(FillJob(len(out), t, opts.batch, opts.seq_len, opts.passes, t + opts.deadline_s))
        t += rng.expovariate(opts.jobs_per_s)
    return out


def trace_jobs(path: str | Path, horizon_s: float) -> list[FillJob]:
    """A CSV of jobs (TRACE_COLUMNS; arrival and deadline in seconds from the run's start), those arriving in
    the run; a bad row fails naming its line."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("bubbletea.fill.trace", f"{p} not found", "use `generator`, or a CSV of " +
                        ",".join(TRACE_COLUMNS))
    out: list[FillJob] = []
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise SpecError("bubbletea.fill.trace", f"{p} lacks the column(s) {', '.join(missing)}",
                            "write the header " + ",".join(TRACE_COLUMNS))
        for line, row in enumerate(reader, start=2):
            try:
                a, b, s, n, d = (float(row["arrival_s"]), int(row["batch"]), int(row["seq_len"]),
                                 int(row["passes"]), float(row["deadline_s"]))
            except (TypeError, ValueError):
                raise SpecError("bubbletea.fill.trace", f"{p} line {line}: not numbers",
                                "write seconds and whole counts") from None
            if not (math.isfinite(a) and math.isfinite(d)) or a < 0 or min(b, s, n) < 1 or d <= 0:
                raise SpecError("bubbletea.fill.trace", f"{p} line {line}: out of range",
                                "arrival_s >= 0, batch, seq_len, passes >= 1, deadline_s > 0")
            if a < horizon_s:
                out.append(FillJob(len(out), a, b, s, n, a + d))
    return sorted(out, key=lambda j: (j.arrival_s, j.job_id))


def fill_jobs(opts: FillOptions, horizon_s: float, seed: int) -> list[FillJob]:
    return generated_jobs(opts, horizon_s, seed) if opts.trace == "generator" else trace_jobs(opts.trace, horizon_s)


def fill_memory_gb(opts: FillOptions, prefill_model: str, tp: int, jobs: list[FillJob]) -> float:
    """What fill takes of each GPU beside training and prefill: its weights (none when it is the prefill model,
    whose weights are resident) and the K and V of its largest pass."""
    model = inference_model(opts.model)
    weights = 0.0 if opts.model == prefill_model else weights_gb(model, tp)
    tokens = max((j.batch * j.seq_len for j in jobs), default=opts.batch * opts.seq_len)
    return weights + tokens * kv_bytes_per_token(model) / tp / 1e9


@dataclass
class _Pass:
    job: FillJob
    layers_left: int


@dataclass
class FillOutcome:
    intervals: list[Interval]
    done_s: dict[int, float]  # job id -> when its last pass ended
    flops: float  # all GPUs together, of the layers that ran
    at_peak_s: float  # GPU seconds those FLOPs take at the GPUs' peak
    busy_peak: float  # busy seconds x GPUs x peak FLOP/s of the layers that ran
    jobs: list[FillJob]


class _Queue:
    """Passes to hand out, earliest deadline first among the jobs arrived by `t`; a job is given up once a pass
    of it started at `t` could not end by its deadline."""

    def __init__(self, jobs: list[FillJob]) -> None:
        self.jobs = sorted(jobs, key=lambda j: (j.arrival_s, j.job_id))
        self.next = 0
        self.ready: list[tuple[float, int]] = []
        self.left = {j.job_id: j.passes for j in jobs}
        self.by_id = {j.job_id: j for j in jobs}

    def take(self, t: float, pass_s: Callable[[FillJob], float]) -> FillJob | None:
        while self.next < len(self.jobs) and self.jobs[self.next].arrival_s <= t:
            j = self.jobs[self.next]
            heapq.heappush(self.ready, (j.deadline_s, j.job_id))
            self.next += 1
        while self.ready:
            d, jid = self.ready[0]
            if not self.left[jid] or t + pass_s(self.by_id[jid]) > d + 1e-12:
                heapq.heappop(self.ready)  # every pass handed out, or given up
                continue
            self.left[jid] -= 1
            return self.by_id[jid]
        return None

    def next_arrival(self) -> float:
        return self.jobs[self.next].arrival_s if self.next < len(self.jobs) else math.inf


def windows(tl: Timeline, guard_s: float) -> list[tuple[float, float, Interval]]:
    """Every group's idle windows in the realised timeline (training and prefill busy), shrunk by the guard
    band, in start order."""
    busy = tuple(k for k in BUSY if k != "fill")
    ivs = [iv for iv in tl.intervals if iv.kind != "idle"]
    out = [(g.start_s + guard_s, g.end_s - guard_s, g) for g in group_gaps(ivs, tl.iteration_s, busy)
           if g.end_s - g.start_s > 2 * guard_s]
    return sorted(out, key=lambda w: (w[0], w[2].stage, w[2].replica))


class _Filler:
    """The fill's state across windows: the queue, the pass each group holds, what ran."""

    def __init__(self, plan: Plan, opts: FillOptions, jobs: list[FillJob], kind: str) -> None:
        self.plan, self.model, self.kind = plan, inference_model(opts.model), kind
        self.queue, self.held = _Queue(jobs), {}
        self.passes_left = {j.job_id: j.passes for j in jobs}
        self.out = FillOutcome([], {}, 0.0, 0.0, 0.0, jobs)
        self.step_s: dict[tuple[str, int, int], float] = {}

    def step(self, dc: str, j: FillJob) -> float:
        """One layer of a pass of `j` on a group in `dc`: the cost model's pass time over the layers."""
        key = (dc, j.batch, j.seq_len)
        if key not in self.step_s:
            self.step_s[key] = prefill_time_s(self.model, self.plan.gpu_types[dc], self.plan.tp, j.seq_len,
                                              j.batch, kind=self.kind) / self.model.layers
        return self.step_s[key]

    def window(self, a: float, b: float, g: Interval) -> None:
        """Whole layers in [a, b] on g's group: its held pass first, then passes the queue hands out."""
        L, key, t = self.model.layers, (g.stage, g.replica), a
        while True:
            p = self.held.get(key)
            if p is None:
                j = self.queue.take(t, lambda j: L * self.step(g.dc, j))
                if j is None:
                    t = max(t, self.queue.next_arrival())
                    if t >= b:
                        return
                    continue
                p = self.held[key] = _Pass(j, L)
            dt = self.step(g.dc, p.job)
            n = min(p.layers_left, int((b - t) / dt + 1e-9))
            if n == 0:
                return
            self._ran(g, p, t, t + n * dt, n)
            t += n * dt

    def _ran(self, g: Interval, p: _Pass, t0: float, t1: float, n: int) -> None:
        out = self.out
        out.intervals.append(Interval(g.iteration, g.gpu, g.dc, g.stage, g.replica, "fill", p.job.job_id, t0, t1,
                                      0.0))
        flops = pass_work(self.model, 1, p.job.seq_len, 0, p.job.batch).flops * n / self.model.layers
        peak = GPUS[self.plan.gpu_types[g.dc]].peak_tflops * 1e12
        out.flops += flops
        out.at_peak_s += flops / peak
        out.busy_peak += (t1 - t0) * self.plan.tp * peak
        p.layers_left -= n
        if p.layers_left == 0:
            del self.held[(g.stage, g.replica)]
            self.passes_left[p.job.job_id] -= 1
            if self.passes_left[p.job.job_id] == 0:
                out.done_s[p.job.job_id] = t1


def run_fill(plan: Plan, tl: Timeline, opts: FillOptions, jobs: list[FillJob], guard_s: float,
             fits: dict[int, bool], kind: str = DEFAULT_PREFILL_MODEL) -> FillOutcome:
    """Fill the windows of `tl` with the jobs' passes (`fits`: per stage, whether fill fits in its memory;
    `kind`: the prefill model that times a pass)."""
    filler = _Filler(plan, opts, jobs, kind)
    for a, b, g in windows(tl, guard_s):
        if fits.get(g.stage, False):
            filler.window(a, b, g)
    return filler.out


def fill_metrics(out: FillOutcome, horizon_s: float, groups: int, tp: int, train_mfu: float) -> dict[str, object]:
    """The fill class's own columns: its time occupancy and useful work (FLOPs as the GPU time they would take at
    the training's MFU, as `prefill_work_util`) as shares of GPU time, its MFU, and its goodput: jobs and tokens
    finished by their deadline. Jobs unfinished at the run's end with their deadline after it are neither met
    nor missed (`fill_jobs_open`)."""
    group_s = horizon_s * groups
    busy = sum(iv.dur for iv in out.intervals)
    met = [j for j in out.jobs if out.done_s.get(j.job_id, math.inf) <= j.deadline_s + 1e-9]
    open_ = [j for j in out.jobs if j.job_id not in out.done_s and j.deadline_s > horizon_s]
    decided = len(out.jobs) - len(open_)
    return {
        "fill_util": round(busy / group_s, 6) if group_s else 0.0,
        "fill_work_util": round(out.at_peak_s / train_mfu / (group_s * tp), 6) if group_s else 0.0,
        "fill_mfu": round(out.flops / out.busy_peak, 6) if out.busy_peak else "",
        "fill_jobs": len(out.jobs),
        "fill_jobs_met": len(met),
        "fill_jobs_open": len(open_),
        "fill_deadline_met": round(len(met) / decided, 6) if decided else "",
        "fill_goodput_jobs_per_s": round(len(met) / horizon_s, 6) if horizon_s else 0.0,
        "fill_goodput_tokens_per_s": round(sum(j.tokens for j in met) / horizon_s, 3) if horizon_s else 0.0,
    }

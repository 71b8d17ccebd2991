"""Run an experiment in the simulator: every sweep point x scheduler, plus its lower bound."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path

from testbed.analysis.metrics import SUMMARY_HEADER, add_speedups, summary_row
from testbed.bubbletea.bubbles import BUBBLES_HEADER, bubble_rows, extract_bubbles
from testbed.bubbletea.run import REQUESTS_HEADER, request_rows, run_bubbletea
from testbed.costs.prefill import inference_model, kv_bytes_per_token
from testbed.errors import SpecError
from testbed.plan.build import build_plan, resolve_dp
from testbed.results import write_csv
from testbed.sim.executor import simulate
from testbed.spec.experiment import Experiment
from testbed.timeline import COMPUTE, Timeline, write_timelines, write_trace


@dataclass
class RunResult:
    summary: dict[str, object]
    timeline: Timeline | None
    events: int
    requests: list[tuple] = field(default_factory=list)
    bubbles: list[tuple] = field(default_factory=list)
    error: SpecError | None = None  # why this (point, scheduler) could not run; its row says `infeasible: ...`


def infeasible(exp: Experiment, run_id: str, scheduler: str, sweep: dict, err: SpecError) -> RunResult:
    """A summary row for a (point, scheduler) the spec allows but no placement or memory budget can run."""
    w = exp.workload
    row: dict[str, object] = dict.fromkeys(SUMMARY_HEADER, "")
    row.update(run_id=run_id, source="sim", scheduler=scheduler, model=w.model if isinstance(w.model, str) else
               w.model.name, tp=w.tp, pp=w.pp, dp=w.dp if w.dp != "auto" else "",
               sweep=";".join(f"{k}={v}" for k, v in sweep.items()), status=f"infeasible: {err}")
    return RunResult(row, None, 0, error=err)


def lower_bound_s(plan) -> float:
    """The same job with the WAN as good as the DC fabric: the physical limit for this placement."""
    tl, _ = simulate(replace(plan, ideal_wan=True, replica_offset_s=[0.0] * plan.dp, run_id=plan.run_id + "-lb"))
    return tl.iteration_s[0]


def run_point(exp: Experiment, index: int, sweep: dict, keep_timeline: bool) -> list[RunResult]:
    """Every scheduler at one sweep point; one that cannot run here gets an infeasible row, not an exception."""
    try:
        dp = resolve_dp(exp)
    except SpecError as e:
        return [infeasible(exp, f"p{index:02d}-{s}", s, sweep, e) for s in exp.schedulers]
    out = []
    bounds: dict[tuple, float] = {}  # schedulers that differ only in the network share one lower bound
    for sched in exp.schedulers:
        try:
            out.append(_run_scheduler(exp, index, sweep, keep_timeline, sched, dp, bounds))
        except SpecError as e:
            out.append(infeasible(exp, f"p{index:02d}-{sched}", sched, sweep, e))
    add_speedups([r.summary for r in out])
    return out


def _run_scheduler(exp: Experiment, index: int, sweep: dict, keep_timeline: bool, sched: str, dp: int,
                   bounds: dict[tuple, float]) -> RunResult:
    """One scheduler at one point; `bounds` shares a lower bound between schedulers that differ only in
    the network."""
    plan = build_plan(exp, sched, run_id=f"p{index:02d}-{sched}", dp=dp)
    tl, events = simulate(plan)
    key = (tuple(map(tuple, plan.stage_dc)), tuple(map(tuple, plan.actions)))
    if key not in bounds:
        bounds[key] = lower_bound_s(plan)
    lb = bounds[key]
    tl = tl.repeated(exp.iterations)
    bt, reqs, bubbles = None, [], None
    if plan.mech.bubbletea:
        res = run_bubbletea(plan, tl, exp.bubbletea, exp.seed)
        train_end = max(iv.end_s for iv in res.timeline.intervals if iv.kind in COMPUTE)
        base_end = max(iv.end_s for iv in tl.intervals if iv.kind in COMPUTE)
        bt = {**res.metrics, "train_slowdown": round(train_end / base_end - 1, 9)}
        kv = kv_bytes_per_token(inference_model(exp.bubbletea.model))
        reqs = list(request_rows(plan.run_id, "sim", res.placements, kv))
        tl, bubbles = res.timeline, res.bubbles
    row = summary_row(plan, tl, lb, sweep, bt)
    rows: list[tuple] = []
    if keep_timeline:
        limit = exp.timeline_replicas
        rows = [b for b in bubble_rows(plan.run_id, "sim", bubbles or extract_bubbles(tl))
                if limit is None or b[5] < limit]
        if limit is not None:
            tl = tl.only_replicas(limit)
    return RunResult(row, tl if keep_timeline else None, events, reqs, rows)


def _run_point_args(args: tuple) -> list[RunResult]:
    return run_point(*args)


def run_experiment(points: list[tuple[Experiment, dict]], jobs: int | None = None,
                   on_point: Callable[[int, list[RunResult]], None] | None = None) -> list[RunResult]:
    """Sweep points run in a process pool; results come back in sweep order (deterministic). `on_point`
    hears of each point as it finishes (in the order they finish)."""
    mode = points[0][0].timeline
    args = [(exp, i, sweep, mode == "all" or (mode == "first-point" and i == 0))
            for i, (exp, sweep) in enumerate(points)]
    jobs = jobs or min(len(args), os.cpu_count() or 1)
    results: list[list[RunResult]] = [[] for _ in args]
    if jobs <= 1 or len(args) == 1:
        for i, a in enumerate(args):
            results[i] = _run_point_args(a)
            if on_point:
                on_point(i, results[i])
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(_run_point_args, a): i for i, a in enumerate(args)}
            for f in as_completed(futures):
                i = futures[f]
                results[i] = f.result()
                if on_point:
                    on_point(i, results[i])
    return [r for point in results for r in point]


def write_outputs(out: Path, results: list[RunResult]) -> list[Path]:
    """Write summary.csv (and timeline.csv, trace.json when timelines were kept); return the paths."""
    paths = [out / "summary.csv"]
    write_csv(paths[0], SUMMARY_HEADER, ([r.summary[k] for k in SUMMARY_HEADER] for r in results))
    tls = [r.timeline for r in results if r.timeline is not None]
    if tls:
        paths += [out / "timeline.csv", out / "trace.json"]
        write_timelines(paths[1], tls)
        write_trace(paths[2], tls)
    bubbles = [b for r in results for b in r.bubbles]
    if bubbles:
        paths.append(out / "bubbles.csv")
        write_csv(paths[-1], BUBBLES_HEADER, bubbles)
    reqs = [q for r in results for q in r.requests]
    if any(r.summary["requests"] != "" for r in results):
        paths.append(out / "requests.csv")
        write_csv(paths[-1], REQUESTS_HEADER, reqs)
    return paths

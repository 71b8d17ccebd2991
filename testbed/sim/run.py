"""Run an experiment in the simulator: every sweep point x scheduler, plus its lower bound."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from testbed.analysis.metrics import SUMMARY_HEADER, summary_row
from testbed.plan.build import build_plan, resolve_dp
from testbed.results import write_csv
from testbed.sim.executor import simulate
from testbed.spec.experiment import Experiment
from testbed.timeline import Timeline, write_timelines, write_trace


@dataclass
class RunResult:
    summary: dict[str, object]
    timeline: Timeline | None
    events: int


def lower_bound_s(plan) -> float:
    """The same job with the WAN as good as the DC fabric: the physical limit for this placement."""
    tl, _ = simulate(replace(plan, ideal_wan=True, replica_offset_s=[0.0] * plan.dp, run_id=plan.run_id + "-lb"))
    return tl.iteration_s[0]


def run_point(exp: Experiment, index: int, sweep: dict, keep_timeline: bool) -> list[RunResult]:
    dp = resolve_dp(exp)
    out = []
    for sched in exp.schedulers:
        plan = build_plan(exp, sched, run_id=f"p{index:02d}-{sched}", dp=dp)
        tl, events = simulate(plan)
        lb = lower_bound_s(plan)
        tl = tl.repeated(exp.iterations)
        if keep_timeline and exp.timeline_replicas is not None:
            tl = tl.only_replicas(exp.timeline_replicas)
        out.append(RunResult(summary_row(plan, tl, lb, sweep), tl if keep_timeline else None, events))
    return out


def _run_point_args(args: tuple) -> list[RunResult]:
    return run_point(*args)


def run_experiment(points: list[tuple[Experiment, dict]], jobs: int | None = None) -> list[RunResult]:
    """Sweep points run in a process pool; results come back in sweep order (deterministic)."""
    mode = points[0][0].timeline
    args = [(exp, i, sweep, mode == "all" or (mode == "first-point" and i == 0))
            for i, (exp, sweep) in enumerate(points)]
    jobs = jobs or min(len(args), os.cpu_count() or 1)
    if jobs <= 1 or len(args) == 1:
        results = [_run_point_args(a) for a in args]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_run_point_args, args))
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
    return paths

"""Run an experiment in the simulator: every sweep point x scheduler, plus its lower bound.

Sweep points run on an engine: a local process pool, or Ray (a local Ray, or an existing cluster at an
address). Either way the results come back in sweep order, so the CSVs are the same byte for byte.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path

from testbed.analysis.metrics import (
    FILL_COLUMNS,
    HEALTH_COLUMNS,
    KV_EMU_COLUMNS,
    KV_WAN_COLUMNS,
    SLOWDOWN_EMU_COLUMNS,
    SUMMARY_HEADER,
    add_speedups,
    summary_row,
)
from testbed.bubbletea.bubbles import BUBBLES_HEADER, bubble_rows, extract_bubbles
from testbed.bubbletea.knee import KNEE_HEADER, knee_header, knees
from testbed.bubbletea.run import REQUESTS_HEADER, request_rows, run_bubbletea, train_mfu
from testbed.costs.prefill import inference_model, kv_bytes_per_token
from testbed.errors import SpecError
from testbed.net.links import NetPlan
from testbed.plan.build import kept_placement, resolve_dp
from testbed.plan.network import lower_network, topology_at
from testbed.plan.plan import Plan
from testbed.results import fmt, write_csv
from testbed.sim.choose import build_plan
from testbed.sim.executor import paused_gc, simulate_changing
from testbed.sim.linkchange import WanSchedule, union_length
from testbed.sim.period import simulate
from testbed.spec.experiment import Experiment
from testbed.timeline import COMPUTE, Timeline, write_timelines, write_trace

ENGINES = ("process", "ray")
LINKRATES_HEADER = ("run_id", "source", "link", "t_s", "gbps")  # a link direction's throughput from t_s on
LINKCHANGES_HEADER = ("run_id", "source", "link", "t_s", "applied_s", "gbps", "latency_ms", "up", "apply_ms")
ITERATIONS_HEADER = ("run_id", "source", "scheduler", "iteration", "start_s", "iteration_s", "wan_stall_s")


@dataclass
class RunResult:
    summary: dict[str, object]
    timeline: Timeline | None
    events: int
    requests: list[tuple] = field(default_factory=list)
    bubbles: list[tuple] = field(default_factory=list)
    error: SpecError | None = None  # why this (point, scheduler) could not run; its row says `infeasible: ...`
    wan: WanRecord | None = None  # what the links did, when the WAN changes


@dataclass
class WanRecord:
    """A run on a changing WAN: each link direction's throughput, the changes applied, the stalls."""

    rates: list[tuple] = field(default_factory=list)  # LINKRATES_HEADER rows
    changes: list[tuple] = field(default_factory=list)  # LINKCHANGES_HEADER rows
    iterations: list[tuple] = field(default_factory=list)  # ITERATIONS_HEADER rows
    stalls: list[tuple[float, float]] = field(default_factory=list)  # (from, to): transfers waited on a down link


def stall_rows(stalls: list[tuple[float, float]], durations: list[float]) -> list[float]:
    """Seconds of each iteration during which some transfer waited on a link that was down."""
    out, t = [], 0.0
    for d in durations:
        out.append(round(union_length(stalls, t, t + d), 9))
        t += d
    return out


def simulate_changing_run(exp: Experiment, scheduler: str, run_id: str, dp: int, wan: WanSchedule,
                          built: NetPlan | None = None) -> tuple[list[Plan], Timeline, int, WanRecord]:
    """Every iteration on its own, back to back, each planned from the WAN as it is when it starts (connection
    counts, stagger, warm-up) and re-rated at every change inside it; `built`: the network as the emulator built
    it (build_plan), for the prediction of an emulated run."""
    plans, parts, t, events = [], [], 0.0, 0
    rec = WanRecord()
    keep: dict | None = None  # the first iteration's placement, for every later one
    for _k in range(exp.iterations):
        at = exp.model_copy(update={"topology": topology_at(exp.topology, wan.states_at(t))})
        plan = build_plan(at, scheduler, run_id=run_id, dp=dp, built=built, **(keep or {}))
        if keep is None:
            keep = kept_placement(plan)
        tl, sim = simulate_changing(plan, wan, t)
        plans.append(plan)
        parts.append(tl)
        events += sim.events
        rec.stalls += sim.wan.stalls  # type: ignore[union-attr]
        for (a, b), rows in sim.wan.link_rates().items():  # type: ignore[union-attr]
            rec.rates += [(run_id, "sim", f"{a}>{b}", fmt(t1, 9), fmt(r * 8 / 1e9, 9)) for t1, r in rows]
        t += tl.iteration_s[0]
    first = [(0.0, 0, pair, wan.state_at(pair, 0.0)) for pair in wan.links]  # the state each link starts in
    for t1, _i, (a, b), st in first + wan.changes:
        if t1 < t:
            rec.changes.append((run_id, "sim", f"{a}-{b}", fmt(t1, 9), fmt(t1, 9), fmt(st.gbps, 9),
                                fmt(st.latency_s * 1e3, 9), int(st.up), 0.0))
    tl = Timeline.joined(parts)
    starts = [sum(tl.iteration_s[:k]) for k in range(len(tl.iteration_s))]
    for k, (t0, d, st) in enumerate(zip(starts, tl.iteration_s, stall_rows(rec.stalls, tl.iteration_s), strict=True)):
        rec.iterations.append((run_id, "sim", scheduler, k, fmt(t0, 9), fmt(d, 9), st))
    return plans, tl, events, rec


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


def apply_costs(exp: Experiment) -> None:
    """Register the experiment's own GPUs and calibration in this process (idempotent)."""
    from testbed.costs.calibration import load_calibration, register_gpus

    if exp.costs.calibration:
        load_calibration(exp.costs.calibration)
    if exp.costs.gpus:
        register_gpus(exp.costs.gpus, "costs.gpus")


def run_point(exp: Experiment, index: int, sweep: dict, keep_timeline: bool) -> list[RunResult]:
    """Every scheduler at one sweep point; one that cannot run here gets an infeasible row, not an exception."""
    apply_costs(exp)  # a worker process of a pool has not seen the spec's GPUs and calibration
    try:
        dp = resolve_dp(exp)
    except SpecError as e:
        return [infeasible(exp, f"p{index:02d}-{s}", s, sweep, e) for s in exp.schedulers]
    out = []
    bounds: dict[tuple, float] = {}  # schedulers that differ only in the network share one lower bound
    for sched in exp.schedulers:
        try:
            with paused_gc():  # a run's tuples and intervals all stay alive: nothing for the collector
                out.append(_run_scheduler(exp, index, sweep, keep_timeline, sched, dp, bounds))
        except SpecError as e:
            out.append(infeasible(exp, f"p{index:02d}-{sched}", sched, sweep, e))
    add_speedups([r.summary for r in out])
    return out


def _run_scheduler(exp: Experiment, index: int, sweep: dict, keep_timeline: bool, sched: str, dp: int,
                   bounds: dict[tuple, float]) -> RunResult:
    """One scheduler at one point; `bounds` shares a lower bound between schedulers that differ only in
    the network."""
    wan = WanSchedule.from_net(lower_network(exp.topology))
    rec = None
    if wan is None:
        plan = build_plan(exp, sched, run_id=f"p{index:02d}-{sched}", dp=dp)
        tl, events = simulate(plan)
    else:  # a WAN that changes: every iteration its own (testbed/sim/linkchange.py)
        plans, tl, events, rec = simulate_changing_run(exp, sched, f"p{index:02d}-{sched}", dp, wan)
        plan = plans[0]
    # everything the bound depends on but the network: placement, schedule, and the costs (the layer split differs
    # between schedulers that place alike)
    rows = (plan.stage_dc, plan.actions, plan.fwd_s, plan.bwd_s, plan.optimizer_s)
    key = tuple(tuple(map(tuple, x)) for x in rows) + (tuple(plan.grad_bytes), str(plan.chunk_fwd_s),
                                                       str(plan.chunk_bwd_s), str(plan.wgrad_s),
                                                       tuple(plan.replica_microbatches))
    if key not in bounds:
        bounds[key] = lower_bound_s(plan)
    lb = bounds[key]
    if wan is None:
        tl = tl.repeated(exp.iterations)
    bt, reqs, bubbles = None, [], None
    if plan.mech.bubbletea:
        res = run_bubbletea(plan, tl, exp.bubbletea, exp.seed, train_mfu(exp.workload.mfu, plan.tp, plan))
        train_end = max(iv.end_s for iv in res.timeline.intervals if iv.kind in COMPUTE)
        base_end = max(iv.end_s for iv in tl.intervals if iv.kind in COMPUTE)
        bt = {"train_slowdown": round(train_end / base_end - 1, 9), **res.metrics}  # realised runs measure theirs
        kv = kv_bytes_per_token(inference_model(exp.bubbletea.model))
        reqs = list(request_rows(plan.run_id, "sim", res.placements, kv))
        tl, bubbles = res.timeline, res.bubbles
    row = summary_row(plan, tl, lb, sweep, bt)
    if rec is not None:
        row["wan_stall_s"] = round(union_length(rec.stalls), 9)
    rows: list[tuple] = []
    if keep_timeline:
        limit = exp.timeline_replicas
        if limit is not None:
            tl = tl.only_replicas(limit)  # bubbles per group need only the groups written
        rows = [b for b in bubble_rows(plan.run_id, "sim", bubbles or extract_bubbles(tl))
                if limit is None or b[5] < limit]
    return RunResult(row, tl if keep_timeline else None, events, reqs, rows, wan=rec)


def _run_point_args(args: tuple) -> list[RunResult]:
    return run_point(*args)


def run_experiment(points: list[tuple[Experiment, dict]], jobs: int | None = None,
                   on_point: Callable[[int, list[RunResult]], None] | None = None, engine: str = "process",
                   address: str | None = None) -> list[RunResult]:
    """Sweep points run on `engine`: a process pool, or Ray (at `address`, else a local Ray). Results come back
    in sweep order whatever order points finish in (deterministic). `on_point` hears of each point as it
    finishes (in the order they finish)."""
    if engine not in ENGINES:
        raise SpecError("--engine", f"unknown engine {engine!r}", f"use one of {', '.join(ENGINES)}")
    mode = points[0][0].timeline
    args = [(exp, i, sweep, mode == "all" or (mode == "first-point" and i == 0))
            for i, (exp, sweep) in enumerate(points)]
    results: list[list[RunResult]] = [[] for _ in args]
    if engine == "ray":
        from testbed.sim.rayengine import run_on_ray

        results = run_on_ray(_run_point_args, args, address, jobs, on_point)
        return [r for point in results for r in point]
    jobs = jobs or min(len(args), os.cpu_count() or 1)
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
    # BubbleTea's KV caches on the WAN and a WAN that changes add their columns (and leave every other run's
    # summary as it was)
    header = (SUMMARY_HEADER + (KV_WAN_COLUMNS if any("kv_wan_bytes" in r.summary for r in results) else ())
              + (KV_EMU_COLUMNS if any("kv_not_arrived" in r.summary for r in results) else ())
              + (FILL_COLUMNS if any("fill_util" in r.summary for r in results) else ())
              + (("wan_stall_s",) if any("wan_stall_s" in r.summary for r in results) else ())
              + (("mechanisms",) if any("mechanisms" in r.summary for r in results) else ())
              + (SLOWDOWN_EMU_COLUMNS if any("train_slowdown_vs_alone" in r.summary for r in results) else ())
              + (HEALTH_COLUMNS if any("timing_error" in r.summary for r in results) else ()))
    write_csv(paths[0], header, ([r.summary.get(k, "") for k in header] for r in results))
    tls = [r.timeline for r in results if r.timeline is not None]
    if tls:
        paths += [out / "timeline.csv", out / "trace.json"]
        write_timelines(paths[1], tls)
        write_trace(paths[2], tls)
    bubbles = [b for r in results for b in r.bubbles]
    if bubbles:
        paths.append(out / "bubbles.csv")
        write_csv(paths[-1], BUBBLES_HEADER, bubbles)
    wans = [r.wan for r in results if r.wan is not None]
    for name, hdr, attr in (("linkrates.csv", LINKRATES_HEADER, "rates"), ("linkchanges.csv", LINKCHANGES_HEADER,
                            "changes"), ("iterations.csv", ITERATIONS_HEADER, "iterations")):
        if wans:
            paths.append(out / name)
            write_csv(paths[-1], hdr, (row for w in wans for row in getattr(w, attr)))
    reqs = [q for r in results for q in r.requests]
    if any(r.summary["requests"] != "" for r in results):
        paths.append(out / "requests.csv")
        write_csv(paths[-1], REQUESTS_HEADER, reqs)
        paths.append(out / "knee.csv")
        header = knee_header([r.summary for r in results])
        write_csv(paths[-1], header, knees((r.summary for r in results), extra=header[len(KNEE_HEADER):]))
    return paths

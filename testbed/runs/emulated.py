"""A training experiment on the emulated WAN, next to the simulator's prediction for the same
configuration, with the relative error per metric (validation.csv)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from testbed.analysis.metrics import add_speedups, summary_row, wan_links_used
from testbed.emu.build import down, up
from testbed.emu.fabric import allreduce_excess_s, bucketed_excess_s, lan_transfer_excess_s
from testbed.emu.health import DEFAULT_BUDGET, PathLink, budget, critical_steps, summary_fields, verdict
from testbed.emu.scale import auto_scale, check_scale, check_transfer_bytes
from testbed.emu.train import run_training
from testbed.errors import NotYetError, SpecError
from testbed.plan.build import resolve_dp
from testbed.plan.network import lower_network
from testbed.results import fmt, write_csv
from testbed.runs.simulated import RunResult, WanRecord, lower_bound_s, simulate_changing_run, stall_rows
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.sim.linkchange import WanSchedule, union_length
from testbed.spec.experiment import Experiment

VALIDATED = ("iteration_s", "gpu_util", "bubble_frac")
BUBBLETEA_VALIDATED = ("served_in_bubbles", "prefill_util")


LOSS_HEADER = ("run_id", "scheduler", "iteration", "loss")
CPU_PREFILL_HEADER = ("run_id", "model", "tokens", "cached", "measured_s", "held_out_predicted_s", "rel_error")
FLOWS_HEADER = ("run_id", "scheduler", "link", "towards", "replica", "iteration", "t_s", "wire_bytes", "scale",
                "link_gbps")
VALIDATION_HEADER = ("run_id", "scheduler", "metric", "sim", "emu", "rel_error", "degraded")  # (sim - emu) / emu


MAX_HOSTS = 16  # emulated hosts per DC at most (the spec's bound on `hosts`)


def host_per_group(exp: Experiment, dp: int) -> Experiment:
    """The experiment with every DC given an emulated host per GPU group any scheduler places there (at least the
    spec's `hosts`, at most MAX_HOSTS). The simulator gives each group its NICs whole, as a GPU's NICs are its own;
    groups that share an emulated host share one NIC of one group's rate towards other hosts and reach each other
    through the host's loopback, unshaped, so their transfers read slower or faster than the model's, not either."""
    counts: dict[str, int] = {}
    for sched in exp.schedulers:
        plan = build_plan(exp, sched, dp=dp)
        for dc in {d for row in plan.stage_dc for d in row}:
            n = sum(row.count(dc) for row in plan.stage_dc)
            counts[dc] = max(counts.get(dc, 0), n)
    dcs = [d.model_copy(update={"hosts": min(MAX_HOSTS, max(d.hosts, counts.get(d.name, 0)))})
           for d in exp.topology.dcs]
    if all(a.hosts == b.hosts for a, b in zip(dcs, exp.topology.dcs, strict=True)):
        return exp
    return exp.model_copy(update={"topology": exp.topology.model_copy(update={"dcs": dcs})})


def changing_run(exp: Experiment, plan, sched: str, dp: int, emu, scale: float, progress, capture: bool,
                 wan: WanSchedule):
    """An emulated run on a WAN that changes, and the simulator's run of it; returns (emulated run, the
    simulated timeline, events, the simulator's record, the emulator's record)."""
    from testbed.emu.wanchange import LiveWan
    from testbed.plan.build import kept_placement
    from testbed.plan.network import opened_connections, topology_at
    from testbed.sim.choose import build_plan
    from testbed.sim.linkchange import Pair

    keep = kept_placement(plan)

    def replan(t: float):
        """This iteration's plan from the WAN as it is now, on the run's placement (hosts do not move)."""
        at = exp.model_copy(update={"topology": topology_at(exp.topology, wan.states_at(t))})
        return build_plan(at, sched, run_id=plan.run_id, dp=dp, built=emu.net, **keep)

    hops: list[Pair] = []
    for row in plan.stage_dc:
        for a, b in zip(row, row[1:], strict=False):
            if a != b and (a, b) not in hops and (b, a) not in hops:
                hops.append((a, b))
    live = LiveWan(emu, wan, scale, hops)
    rates = {pair: [(st.capacity_bytes_s, st.latency_s) for st in states] for pair, (_, states) in wan.links.items()}
    try:
        run = run_training(plan, emu, exp.iterations, progress, exp.emulation.compute, None, None, capture=capture,
                           live=live, replan=replan, conns=opened_connections(exp, plan.mech, emu.net, rates))
    finally:
        live.close()
    durations = run.timeline.iteration_s
    starts = run.starts
    rates, changes, stalls = live.report(plan.run_id, starts, durations)
    rec = WanRecord(rates, changes, [], stalls)
    clock = [sum(durations[:k]) for k in range(len(durations))]
    for k, (c, d, st) in enumerate(zip(clock, durations, stall_rows(stalls, durations), strict=True)):
        rec.iterations.append((plan.run_id, "emu", sched, k, fmt(c, 6), fmt(d, 6), st))
    _, tl_sim, events, sim_rec = simulate_changing_run(exp, sched, plan.run_id, dp, wan, built=emu.net)
    return run, tl_sim, events, sim_rec, rec


def changed_iterations(wan: WanSchedule, runs: list[list[float]]) -> tuple[int, int]:
    """The first and last iteration, in any of `runs` (iteration lengths), that a change after time 0 falls in."""
    found = []
    for durations in runs:
        t = 0.0
        for k, d in enumerate(durations):
            if any(t <= c[0] < t + d for c in wan.changes):
                found.append(k)
            t += d
    return (min(found), max(found)) if found else (0, -1)


def emulated_experiment(exp: Experiment) -> Experiment:
    """The experiment as the emulator runs it: the Atlas sidecar reactive unless the spec names `predictive` (its
    workers then announce each WAN send as the compute producing it starts, testbed/runtime/announce.py), so the
    simulator's prediction of an emulated run hands turns over as the emulated run does. `auto` stays reactive on
    the emulated WAN: predictive emulated runs agreed less well with their prediction than reactive ones where the
    predicted gain was largest (docs/training.md, "Predictive vs reactive"). Its windows and turns come from the
    network built (`build_plan(..., built=emu.net)`)."""
    if exp.network.sidecar == "predictive":
        return exp
    return exp.model_copy(update={"network": exp.network.model_copy(update={"sidecar": "reactive"})})


def assess(plan, run, iteration_s: float, limit: float) -> tuple[dict[str, object], str]:
    """The run's timing-health columns (testbed/emu/health.py) and why it is degraded ("" if it is not): the
    other causes the run reported, then its timing error over `limit` or the WAN's drops."""
    hops = sum(1 for a, b in zip(plan.stage_dc[0], plan.stage_dc[0][1:], strict=False) if a != b)
    waits, crossings = critical_steps(plan.pp, plan.microbatches, hops)
    biggest = max(plan.act_bytes, default=0.0)
    used = {f"{a}-{b}": PathLink(biggest / lp.transfer_rate_bytes_s if lp.transfer_rate_bytes_s > 0 else 0.0,
                                 lp.transfer_cap_bytes_s < lp.capacity_bytes_s)
            for a, b in wan_links_used(plan) for lp in (plan.links[(a, b)],)}
    b = budget(run.health, iteration_s, waits, crossings, used)
    b = dataclasses.replace(b, fabric=fabric_share(plan, run.timeline.steady().intervals, iteration_s))
    why = "; ".join(x for x in (run.degraded, verdict(run.health, b, limit)) if x)
    return {**summary_fields(run.health, b), "timing_budget": limit}, why


def fabric_share(plan, intervals: list, iteration_s: float) -> float:
    """The iteration-time error a slow emulated DC fabric can cause (testbed/emu/fabric.py): every message inside a
    DC on replica 0's critical path late by the mean measured, and the slowest all-reduce inside a DC or the most
    a stage's bucketed collectives inside a DC took beyond their rings' time in one iteration."""
    if iteration_s <= 0:
        return 0.0
    bw = {d: x.bandwidth_bytes_s for d, x in plan.intra.items()}
    lat = {d: x.latency_s for d, x in plan.intra.items()}
    row = plan.stage_dc[0]
    lan = sum(1 for a, b in zip(row, row[1:], strict=False) if a == b)
    _, crossings = critical_steps(plan.pp, plan.microbatches, lan)
    late = crossings * lan_transfer_excess_s(intervals, bw, lat) + max(
        allreduce_excess_s(intervals, plan.grad_bytes, bw, lat), bucketed_excess_s(intervals, bw, lat))
    return late / iteration_s


def unpaired_exchange(programs: dict) -> str:
    """"" if every collective's exchanges pair up (each group a peer receives from sends to it in turn), else one
    pair that does not. The workers open their ring connections from these exchanges: a receive nobody sends
    waits out the connection timeout."""
    from testbed.program import collective_exchanges, ring_collectives

    sends: dict[tuple, set[str]] = {}
    recvs: list[tuple[tuple, str, str]] = []
    for prog in programs.values():
        for k, st in enumerate(dict.fromkeys(ring_collectives(prog.steps))):
            for ex in collective_exchanges(st, prog.group):
                sends.setdefault((k, ex.send_to), set()).add(prog.group)
                recvs.append(((k, prog.group), ex.recv_from, prog.group))
    for key, sender, group in recvs:
        if sender not in sends.get(key, set()):
            return f"{group} receives from {sender}, which never sends to it"
    return ""


def check_emulable(exp: Experiment) -> None:
    if exp.emulation.backend == "mininet":
        raise NotYetError("emulated training runs on the mininet backend: use netns, docker or containernet")
    if exp.bubbletea.fill is not None and any("+bubbletea" in s for s in exp.schedulers):
        raise NotYetError("bubbletea.fill in an emulated run (the workers serve prefill only); simulate it "
                          "(testbed sim), or remove bubbletea.fill")


def check_programs(plan, compute: str) -> None:
    """The plan's programs fit together (every send has its receive, no deadlock), and the workers can
    run their all-reduce (torch compute does the flat ring only)."""
    from testbed.plan.lower import dry_run, lower
    from testbed.program import AllReduce, ReduceScatter

    programs = lower(plan)
    problems = dry_run(programs)
    if problems:
        raise SpecError("schedulers", f"{plan.scheduler}: the lowered programs do not fit together: {problems[0]}",
                        "report it: a plan should always lower")
    unpaired = unpaired_exchange(programs)
    if unpaired:
        raise NotYetError(f"{plan.scheduler}: the emulated workers' collective across DCs with DCs holding different "
                          f"numbers of replicas ({unpaired}); simulate it, or give every DC the same number of "
                          "replicas of each stage")
    if compute == "torch" and plan.diloco is not None:
        raise NotYetError(f"{plan.scheduler}: torch compute of a sync period (real outer gradients in the workers); "
                          "use modeled compute, or examples/diloco.py under testbed launch")
    if compute == "torch" and any(isinstance(st, AllReduce) and st.algorithm == "hierarchical"
                                  for p in programs.values() for st in p.steps):
        raise NotYetError(f"{plan.scheduler}: torch compute with a stage's replicas in several DCs (a hierarchical "
                          "all-reduce); use modeled compute, or a placement that keeps each stage in one DC")
    if plan.mech.bubbletea and (plan.virtual_stages > 1 or plan.wgrad_s):
        raise NotYetError(f"{plan.scheduler}: emulated BubbleTea with virtual_stages={plan.virtual_stages} or the "
                          "zero-bubble schedule (its replay without prefill matches a worker's intervals by "
                          "microbatch, not yet by chunk or split backward); simulate it, or use plain 1F1B")
    if compute == "torch" and plan.wgrad_s:
        raise NotYetError(f"{plan.scheduler}: torch compute with the zero-bubble schedule (a worker's backward is one "
                          "autograd call); use modeled compute, or schedule: 1f1b")
    if compute == "torch" and plan.virtual_stages > 1:
        raise NotYetError(f"{plan.scheduler}: torch compute with virtual_stages={plan.virtual_stages} (a worker "
                          "builds one model chunk); use modeled compute, or virtual_stages: 1")
    bucketed = any(isinstance(st, ReduceScatter) for p in programs.values() for st in p.steps)
    if bucketed and (compute == "torch" or plan.mech.bubbletea):
        raise NotYetError(f"{plan.scheduler}: {'torch compute' if compute == 'torch' else 'BubbleTea'} with the "
                          f"overlap mechanism's bucketed collectives; use modeled compute, or {plan.scheduler}-overlap")


def size_to_machine(points: list[tuple[Experiment, dict]], timing_budget: float, probe_s: float = 1.0
                    ) -> tuple[list[tuple[Experiment, dict]], list[str]]:
    """Every point with the k this machine's headroom allows (testbed/emu/headroom.py: measured once, in a probe
    of `probe_s`), and what the user should know: the probe, a chosen k that will not hold, workers whose
    timing the machine will not keep (first point, every scheduler)."""
    from testbed.emu.headroom import probe, size, worker_warning

    h = probe(probe_s)
    lines = [f"headroom: {h.free_cpus:.1f} of {h.cpus} CPUs free, timers {h.wake_late_mean_s * 1e3:.2f} ms late "
             f"(a {h.probe_s:.1f} s probe)"]
    out = []
    for exp, point in points:
        sz = size(exp.topology, h, exp.emulation.scale or None)
        if not exp.emulation.scale:
            lines.append(f"k = {sz.scale:g}: the fastest link at {sz.target_mbps:.0f} Mbit/s")
        lines += [w for w in sz.warnings if w not in lines]
        out.append((exp.model_copy(update={"emulation": exp.emulation.model_copy(update={"scale": sz.scale})}),
                    point))
    exp = out[0][0]
    try:
        exp = emulated_experiment(exp)
        dp = resolve_dp(exp)
        for sched in exp.schedulers:
            plan = build_plan(exp, sched, dp=dp, built=lower_network(exp.topology, exp.emulation.scale))
            hops = sum(1 for a, b in zip(plan.stage_dc[0], plan.stage_dc[0][1:], strict=False) if a != b)
            w = worker_warning(h, plan.pp, plan.dp, plan.microbatches, hops, simulate(plan)[0].iteration_s[0],
                               timing_budget)
            if w and w not in lines:
                lines.append(w)
    except SpecError:
        pass  # preflight says what is wrong with the point, in its words
    return out, lines


def preflight(points: list[tuple[Experiment, dict]]) -> None:
    """Plan every point and scheduler and check its scale before any topology is built, so a bad point
    fails with one line and leaves nothing behind, not after the points before it ran."""
    for exp, point in points:
        try:
            scale = exp.emulation.scale or auto_scale(exp.topology)
            check_scale(exp.topology, scale, lan_gpus_per_host=exp.workload.tp)
            exp = emulated_experiment(exp)
            dp, built = resolve_dp(exp), lower_network(exp.topology, scale)
            for sched in exp.schedulers:
                plan = build_plan(exp, sched, dp=dp, built=built)
                check_transfer_bytes(plan.act_bytes, plan.grad_bytes, plan.dp, scale)
                check_programs(plan, exp.emulation.compute)
        except SpecError as e:
            where = ", ".join(f"{k}={v}" for k, v in point.items())
            raise SpecError(e.field, f"{e.problem} (at sweep point {where})" if where else e.problem, e.fix) from None


@dataclass
class PointResult:
    """Everything one sweep point produced: the emulated runs (and, for modeled compute, the simulator's rows beside
    them), the validation, the losses, the flows (HTB class counters, FLOWS_HEADER, or with a capture its flows.csv
    rows: testbed.analysis.flows.FLOWS_HEADER) and, with BubbleTea and real compute, the prefill model fitted to this
    CPU, pass by pass."""

    results: list[RunResult] = field(default_factory=list)
    validation: list[tuple] = field(default_factory=list)
    losses: list[tuple] = field(default_factory=list)
    flows: list[tuple] = field(default_factory=list)
    cpu_prefill: list[tuple] = field(default_factory=list)
    durations: dict[str, list[float]] = field(default_factory=dict)  # scheduler -> steady iterations (emulated)
    cpu: object = None  # the CPU's prefill calibration, fitted once per point


def run_point(exp: Experiment, index: int, sweep: dict, progress=None, capture: bool = False, on_up=None,
              timing_budget: float = DEFAULT_BUDGET, cluster=None) -> PointResult:
    """Emulated runs (and, for modeled compute, the simulator's rows and the validation) of one point, every
    scheduler on one network. `on_up(emu)` runs once the network is up, before any training (e.g. to measure the
    links). A run whose timing error (testbed/emu/health.py) exceeds `timing_budget` is marked degraded."""
    em = exp.emulation
    scale = em.scale or auto_scale(exp.topology)
    exp = emulated_experiment(exp)
    dp = resolve_dp(exp)
    exp = host_per_group(exp, dp)
    out = PointResult()
    emu, take_down = bring_up(exp, dp, scale, capture, cluster)
    wan = WanSchedule.from_net(emu.net)
    try:
        if on_up is not None:
            on_up(emu)
        for sched in exp.schedulers:
            plan = build_plan(exp, sched, run_id=f"p{index:02d}-{sched}", dp=dp, built=emu.net)
            if wan is not None:
                out.results += _changing_point(exp, plan, sched, dp, emu, scale, progress, capture, wan, sweep,
                                               out.validation, out.flows, timing_budget)
            else:
                _static_run(exp, plan, emu, scale, progress, capture, sweep, timing_budget, out)
    finally:
        take_down(emu)
    if wan is None:
        _slowdowns_vs_alone(out)
    out.validation += slowdown_validation([r.summary for r in out.results])
    add_speedups([r.summary for r in out.results])
    return out


def _service(exp: Experiment, plan, out: PointResult) -> tuple[dict | None, list]:
    """The BubbleTea service's configuration and its requests for a BubbleTea scheduler (None, [] otherwise); with
    real compute, the CPU's prefill is calibrated once per point."""
    if not plan.mech.bubbletea:
        return None, []
    from testbed.bubbletea.emulated import DECODE_TOKENS, calibrate_cpu, service_config

    em = exp.emulation
    if em.compute == "torch" and out.cpu is None:
        out.cpu = cpu = calibrate_cpu(exp.bubbletea.model)
        out.cpu_prefill = [(plan.run_id, exp.bubbletea.model, *r[:2], fmt(r[2], 6), fmt(r[3], 6), round(r[4], 4))
                           for r in cpu.rows]
    T = simulate(plan)[0].iteration_s[0]  # (real compute runs at the CPU's pace: ask for plenty)
    horizon = 2.0 * max(1, exp.iterations - 1) * T if em.compute == "modeled" else 600.0
    svc, reqs = service_config(plan, exp, horizon, out.cpu.calibration if out.cpu else None)  # type: ignore[attr-defined]
    svc["decode_tokens"] = DECODE_TOKENS
    svc["ship_kv"] = exp.bubbletea.ship_kv
    return svc, reqs


def _static_run(exp: Experiment, plan, emu, scale: float, progress, capture: bool, sweep: dict,
                timing_budget: float, out: PointResult) -> None:
    """One scheduler on a WAN that does not change: its emulated row and, for modeled compute, the simulator's
    prediction beside it and their validation."""
    em, sched = exp.emulation, plan.scheduler
    torch_cfg = None
    if em.compute == "torch":
        from testbed.costs.models import resolve_model
        from testbed.emu.train import torch_config

        torch_cfg = torch_config(plan, resolve_model(exp.workload.model, exp.workload.seq_len), em.lr)
    svc, reqs = _service(exp, plan, out)
    run = run_training(plan, emu, exp.iterations, progress, em.compute, torch_cfg, svc, capture=capture)
    out.flows += run.captured
    out.durations[sched] = run.timeline.iteration_s[1:] or run.timeline.iteration_s
    out.losses += [(plan.run_id, sched, k, round(loss, 6)) for k, loss in enumerate(run.losses)]
    gbps = {"-".join(lk.between): lk.gbps for lk in exp.topology.links}  # the spec's rate, as configured
    for it, t, link, dev, r, sent in run.flows:
        out.flows.append((plan.run_id, sched, link, dev, r, it, fmt(t, 6), sent, scale, gbps.get(link, "")))
    tl_emu = run.timeline.steady()
    health, note = assess(plan, run, sum(tl_emu.iteration_s) / len(tl_emu.iteration_s), timing_budget)
    bt_metrics, req_rows = None, []
    if svc is not None:
        bt_metrics, req_rows = _emulated_requests(plan, exp, svc, reqs, run, em.compute == "torch")
        bt_metrics.update(_slowdown_in_run(plan, run.timeline))
    row_emu = summary_row(plan, tl_emu, lower_bound_s(plan), sweep, bt_metrics, degraded=note, scale=scale) | health
    out.results.append(RunResult(row_emu, tl_emu, 0, req_rows))
    if em.compute == "modeled":  # real compute runs on this CPU: the cost model's GPU times do not apply
        _predict(exp, plan, svc, sweep, scale, note, out)


def _predict(exp: Experiment, plan, svc: dict | None, sweep: dict, scale: float, note: str, out: PointResult) -> None:
    """The simulator's prediction of the emulated run just added to `out` (on the same trace and steady horizon for
    BubbleTea), inserted before it, and the validation of each metric."""
    sched, lb = plan.scheduler, lower_bound_s(plan)
    tl_sim, events = simulate(plan)
    steady = max(1, exp.iterations - 1)
    sim_reqs: list[tuple] = []
    if svc is not None:
        from testbed.bubbletea.run import request_rows, run_bubbletea, train_mfu
        from testbed.costs.prefill import inference_model, kv_bytes_per_token

        res = run_bubbletea(plan, tl_sim.repeated(steady), exp.bubbletea, exp.seed,
                            train_mfu(exp.workload.mfu, plan.tp, plan))
        slowed = float(res.metrics.get("train_slowdown", 0.0)) + 0.0  # + 0.0: no -0.0
        row_sim = summary_row(plan, res.timeline, lb, sweep, {**res.metrics, "train_slowdown": slowed}, scale=scale)
        tl_pred = res.timeline
        sim_reqs = list(request_rows(plan.run_id, "sim", res.placements,
                                     kv_bytes_per_token(inference_model(exp.bubbletea.model))))
    else:
        tl_pred = tl_sim.repeated(steady)
        row_sim = summary_row(plan, tl_pred, lb, sweep, scale=scale)
    row_emu = out.results[-1].summary
    out.results.insert(-1, RunResult(row_sim, tl_pred, events, sim_reqs))
    for m in VALIDATED + (BUBBLETEA_VALIDATED if svc is not None else ()):
        a, b = float(row_sim[m]), float(row_emu[m])
        out.validation.append((plan.run_id, sched, m, a, b, round((a - b) / b, 6) if b else "", note))
    if svc is not None:  # like with like: the same requests (the engines' runs last different times)
        from testbed.bubbletea.emulated import served_same_requests

        a, b, _n = served_same_requests(sim_reqs, out.results[-1].requests)
        out.validation.append((plan.run_id, sched, "served_in_bubbles@same_requests", round(a, 6), round(b, 6),
                               round((a - b) / b, 6) if b else "", note))
        out.validation.append((plan.run_id, sched, "bubble_served_ratio@same_requests", 1.0,
                               round(b / a, 6) if a else "", round((a - b) / b, 6) if a and b else "", note))


def _slowdowns_vs_alone(out: PointResult) -> None:
    """Each emulated `X+bubbletea` row's training slowdown against `X` alone in the same point (median and spread of
    the paired steady iterations)."""
    from testbed.bubbletea.emulated import slowdown

    for r in out.results:
        name = str(r.summary["scheduler"])
        if r.summary["source"] == "emu" and name.endswith("+bubbletea") and name[:-10] in out.durations:
            med, p25, p75 = slowdown(out.durations[name], out.durations[name[:-10]])
            r.summary.update(train_slowdown_vs_alone=round(med, 6), train_slowdown_vs_alone_p25=round(p25, 6),
                             train_slowdown_vs_alone_p75=round(p75, 6))


def slowdown_validation(rows: list[dict]) -> list[tuple]:
    """Per BubbleTea scheduler: the simulator's train_slowdown (its realised run, KV flows included, against the
    same run without prefill) beside the emulated one measured inside the run (waits for prefill only) and
    against the separate run without BubbleTea (everything, the KV caches' effect on transfers included).
    No relative error: slowdowns lie near 0, where it means nothing; read sim - emu in points."""
    sims = {(r["run_id"], r["scheduler"]): r for r in rows if r["source"] == "sim"}
    out = []
    for r in rows:
        s = sims.get((r["run_id"], r["scheduler"]))
        if r["source"] != "emu" or s is None or s.get("train_slowdown", "") == "":
            continue
        for m in ("train_slowdown", "train_slowdown_vs_alone"):
            if r.get(m, "") != "":
                out.append((r["run_id"], r["scheduler"], m, float(s["train_slowdown"]), float(r[m]), "",
                            r.get("degraded", "")))
    return out


def _slowdown_in_run(plan, timeline) -> dict:
    """`train_slowdown` and its spread, measured inside the run: each steady iteration against itself replayed
    without training's waits for prefill (testbed/bubbletea/without_prefill.py); empty if the timeline does not
    hold every op the programs name (a degraded run)."""
    from testbed.bubbletea.without_prefill import ReplayError, paired_slowdowns, summary
    from testbed.plan.lower import lower

    try:
        rel = paired_slowdowns(lower(plan), timeline, first=1 if len(timeline.iteration_s) > 1 else 0)
    except ReplayError:
        rel = []
    if not rel:
        return {"train_slowdown": "", "train_slowdown_p25": "", "train_slowdown_p75": ""}
    med, p25, p75 = summary(rel)
    return {"train_slowdown": round(med, 6), "train_slowdown_p25": round(p25, 6), "train_slowdown_p75": round(p75, 6)}


def _emulated_requests(plan, exp: Experiment, svc: dict, reqs: list, run, real_compute: bool
                       ) -> tuple[dict, list[tuple]]:
    """The emulated run's serving metrics and requests.csv rows, from what its BubbleTea service recorded."""
    from testbed.bubbletea.emulated import served_requests
    from testbed.costs.prefill import inference_model, kv_bytes_per_token

    homes = {int(r[0]): r[4] for r in svc["requests"]}
    rows, metrics = served_requests(plan, exp, reqs, homes, run.bubbletea, run.starts, run.timeline.iteration_s,
                                    real_compute)
    kv = kv_bytes_per_token(inference_model(exp.bubbletea.model))
    out = []
    for rid, arrival, tokens, gpu, dc, start, end, chunks, in_bubble, home, kv_ready, queue, reason in rows:
        out.append((plan.run_id, "emu", rid, fmt(arrival, 6), tokens, gpu, dc, fmt(start, 6), fmt(end, 6),
                    fmt(end - arrival, 6), chunks, in_bubble, home, int(kv * tokens),
                    fmt(kv_ready, 6) if kv_ready != "" else "", fmt(queue, 6), reason))
    return metrics, out


def _changing_point(exp: Experiment, plan, sched: str, dp: int, emu, scale: float, progress, capture: bool,
                    wan: WanSchedule, sweep: dict, validation: list, flows: list,
                    timing_budget: float = DEFAULT_BUDGET) -> list[RunResult]:
    """The emulated and simulated rows of one scheduler on a changing WAN, and the validation of each
    iteration's time (the first, with TCP's slow start, is left out of the summary as usual)."""
    if exp.emulation.compute != "modeled":
        raise NotYetError("a changing WAN with torch compute: use compute: modeled")
    run, tl_sim, events, sim_rec, emu_rec = changing_run(exp, plan, sched, dp, emu, scale, progress, capture, wan)
    flows += run.captured
    for it, t, link, dev, r, sent in run.flows:
        flows.append((plan.run_id, sched, link, dev, r, it, fmt(t, 6), sent, scale))
    lb = lower_bound_s(plan)
    tl_emu, tl_s = run.timeline.steady(), tl_sim.steady()
    skip = sum(run.timeline.iteration_s) - sum(tl_emu.iteration_s)  # the steady rows start after iteration 0
    skip_sim = sum(tl_sim.iteration_s) - sum(tl_s.iteration_s)
    health, run.degraded = assess(plan, run, sum(tl_emu.iteration_s) / len(tl_emu.iteration_s), timing_budget)
    row_emu = summary_row(plan, tl_emu, lb, sweep, degraded=run.degraded, scale=scale) | health
    row_emu["wan_stall_s"] = round(union_length(emu_rec.stalls, skip), 6)
    row_sim = summary_row(plan, tl_s, lb, sweep, scale=scale)
    row_sim["wan_stall_s"] = round(union_length(sim_rec.stalls, skip_sim), 9)
    for m in VALIDATED:
        a, b = float(row_sim[m]), float(row_emu[m])
        validation.append((plan.run_id, sched, m, a, b, round((a - b) / b, 6) if b else "", run.degraded))
    for k, (a, b) in enumerate(zip(tl_sim.iteration_s, run.timeline.iteration_s, strict=True)):
        validation.append((plan.run_id, sched, f"iteration_s@{k}", round(a, 6), round(b, 6), round((a - b) / b, 6),
                           run.degraded))
    lo, hi = changed_iterations(wan, [tl_sim.iteration_s, run.timeline.iteration_s])
    if lo <= hi:  # the iterations the changes fall in, in either engine: where their iteration boundaries fall
        a, b = sum(tl_sim.iteration_s[lo:hi + 1]), sum(run.timeline.iteration_s[lo:hi + 1])  # may differ
        validation.append((plan.run_id, sched, f"iteration_s@{lo}-{hi}", round(a, 6), round(b, 6),
                           round((a - b) / b, 6), run.degraded))
    return [RunResult(row_sim, tl_sim, events, wan=sim_rec), RunResult(row_emu, run.timeline, 0, wan=emu_rec)]


@dataclass
class EmulatedExperiment:
    """Everything an emulated experiment produced, point after point, ready to be written."""
    results: list = field(default_factory=list)
    validation: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    flows: list = field(default_factory=list)
    cpu_prefill: list = field(default_factory=list)
    links: list[dict] = field(default_factory=list)
    captured: bool = False


def bring_up(exp: Experiment, dp: int, scale: float, capture: bool, cluster=None):
    """The emulated network, on this machine or each machine its part (docs/cluster.md), and what takes it down."""
    em = exp.emulation
    if cluster is None:
        return up(exp.topology, backend=em.backend, prefix=em.prefix, scale=scale, delay=em.delay,
                  lan_gpus_per_host=exp.workload.tp, realtime=em.realtime, **exp.network.host_tcp), down
    from testbed.cluster import driver

    check_cluster_point(exp, dp, capture)
    emu = driver.up(exp.topology, cluster, em.prefix, scale, em.delay, lan_gpus_per_host=exp.workload.tp,
                    realtime=em.realtime, **exp.network.host_tcp)  # each machine's clock measured (cluster/clock.py)
    return emu, driver.down


def check_cluster_point(exp: Experiment, dp: int, capture: bool) -> None:
    """What a run on a cluster cannot do yet, refused before anything is built."""
    em = exp.emulation
    if capture or em.compute != "modeled" or em.backend != "netns":
        raise NotYetError("on a cluster: not yet with --capture, torch compute or a container backend "
                          "(docs/cluster.md)")
    if WanSchedule.from_net(lower_network(exp.topology)) is not None:
        raise NotYetError("a changing WAN on a cluster: not yet")
    if exp.network.sidecar == "predictive":  # announcements across a split link's two sidecars are untested
        raise NotYetError("network.sidecar: predictive on a cluster: not yet (use auto or reactive there)")
    for sched in exp.schedulers:
        plan = build_plan(exp, sched, dp=dp)
        if plan.mech.bubbletea:
            raise NotYetError(f"{sched} on a cluster: not yet (the BubbleTea service and its decoders)")


def run_experiment(points: list[tuple[Experiment, dict]], check: bool, capture: bool,
                   step: Callable[[], None], line: Callable[[str], None],
                   timing_budget: float = DEFAULT_BUDGET, cluster=None) -> EmulatedExperiment:
    """Every sweep point on the emulated WAN, one after the other; with `check`, every WAN pair of the
    first point's network is measured before training (links.csv). `step` is called after each emulated
    iteration, `line` with a message worth showing."""
    from testbed.emu.check import check_links

    check_emulable(points[0][0])
    run = EmulatedExperiment(captured=capture)

    def measure(emu) -> None:
        if not run.links:
            run.links.extend(check_links(emu, streams=8, seconds=2.0, pings=20))

    for i, (exp, point) in enumerate(points):
        if check and i == 0:
            line("measuring every WAN pair (links.csv)")
        res = run_point(exp, i, point, step, capture, on_up=measure if check and i == 0 else None,
                        timing_budget=timing_budget, cluster=cluster)
        run.results += res.results
        run.validation += res.validation
        run.losses += res.losses
        run.flows += res.flows
        run.cpu_prefill += res.cpu_prefill
    return run


def write_experiment(out: Path, run: EmulatedExperiment) -> list[Path]:
    """summary/timeline/... as the simulator writes them, then the emulator's own CSVs (each only if it has
    rows), each written whole or not at all."""
    from testbed.analysis import flows as captured_flows
    from testbed.emu.check import LINKS_HEADER
    from testbed.runs.simulated import write_outputs

    paths = write_outputs(out, run.results)
    tables = [("links.csv", LINKS_HEADER, [[r[c] for c in LINKS_HEADER] for r in run.links]),
              ("validation.csv", VALIDATION_HEADER, run.validation),
              ("loss.csv", LOSS_HEADER, run.losses),
              ("flows.csv", captured_flows.FLOWS_HEADER if run.captured else FLOWS_HEADER, run.flows),
              ("cpu_prefill.csv", CPU_PREFILL_HEADER, run.cpu_prefill)]
    for name, header, rows in tables:
        if rows:
            paths.append(out / name)
            write_csv(paths[-1], header, rows)
    return paths

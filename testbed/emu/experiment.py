"""A training experiment on the emulated WAN, next to the simulator's prediction for the same
configuration, with the relative error per metric (validation.csv)."""

from __future__ import annotations

from testbed.analysis.metrics import summary_row
from testbed.emu.build import MIN_WINDOW, down, up
from testbed.emu.scale import auto_scale
from testbed.emu.train import run_training
from testbed.errors import NotYetError
from testbed.plan.build import build_plan, resolve_dp
from testbed.plan.mechanisms import parse_scheduler
from testbed.sim.executor import simulate
from testbed.sim.run import RunResult, lower_bound_s
from testbed.spec.experiment import Experiment
from testbed.spec.topology import Topology

VALIDATED = ("iteration_s", "gpu_util", "bubble_frac")
LOSS_HEADER = ("run_id", "scheduler", "iteration", "loss")
VALIDATION_HEADER = ("run_id", "scheduler", "metric", "sim", "emu", "rel_error", "degraded")  # (sim - emu) / emu


def as_emulated(topo: Topology, scale: float) -> Topology:
    """The topology the emulator really builds: windows below 64 KiB (after scaling) are raised."""
    links = []
    for link in topo.links:
        w = max(topo.window_mb(link), MIN_WINDOW * scale / 2**20)
        links.append(link.model_copy(update={"tcp_window_mb": w}))
    return topo.model_copy(update={"links": links})


def check_emulable(exp: Experiment) -> None:
    for name in exp.schedulers:
        if parse_scheduler(name).bubbletea:
            raise NotYetError(f"scheduler {name}: the BubbleTea service is not built for emulated runs yet; "
                              f"`testbed sim` runs it")
    if exp.emulation.backend != "netns":
        raise NotYetError("emulated training runs use the netns backend for now")




def run_point(exp: Experiment, index: int, sweep: dict, progress=None
              ) -> tuple[list[RunResult], list[tuple], list[tuple]]:
    """Emulated runs (and, for modeled compute, the simulator's rows and the validation) of one point."""
    em = exp.emulation
    scale = em.scale or auto_scale(exp.topology)
    same = exp.model_copy(update={"topology": as_emulated(exp.topology, scale)})
    dp = resolve_dp(same)
    results: list[RunResult] = []
    validation: list[tuple] = []
    losses: list[tuple] = []
    emu = up(exp.topology, backend=em.backend, prefix=em.prefix, scale=scale, delay=em.delay,
             lan_gpus_per_host=exp.workload.tp)
    try:
        for sched in exp.schedulers:
            plan = build_plan(same, sched, run_id=f"p{index:02d}-{sched}", dp=dp)
            plan.scale = scale
            torch_cfg = None
            if em.compute == "torch":
                from testbed.costs.models import resolve_model
                from testbed.emu.train import torch_config

                torch_cfg = torch_config(plan, resolve_model(exp.workload.model, exp.workload.seq_len), em.lr)
            tl_full = run_training(plan, emu, exp.iterations, progress, em.compute, torch_cfg)
            for k, loss in enumerate(getattr(tl_full, "losses", [])):
                losses.append((plan.run_id, sched, k, round(loss, 6)))
            note = getattr(tl_full, "degraded", "")
            tl_emu = tl_full.steady()
            lb = lower_bound_s(plan)
            results.append(RunResult(summary_row(plan, tl_emu, lb, sweep, degraded=note), tl_emu, 0))
            if em.compute != "modeled":
                continue  # real compute on this CPU: the cost model's GPU times do not apply
            tl_sim, events = simulate(plan)
            row_sim = summary_row(plan, tl_sim.repeated(len(tl_emu.iteration_s)), lb, sweep)
            row_emu = results[-1].summary
            results.insert(-1, RunResult(row_sim, tl_sim.repeated(exp.iterations), events))
            for m in VALIDATED:
                a, b = float(row_sim[m]), float(row_emu[m])
                validation.append((plan.run_id, sched, m, a, b, round((a - b) / b, 6) if b else "", note))
    finally:
        down(emu)
    return results, validation, losses

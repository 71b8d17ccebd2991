"""One iteration's simulated time for any family, a low-communication one's from two short sync periods.

A sync period of DiLoCo or Streaming DiLoCo is linear in H: each fragment's sync overlaps the same tau inner
steps whatever H, and the other inner steps are alike (a pipeline flush each, no WAN traffic). So the period of
H inner steps is p(H1) + (H - H1) (p(H2) - p(H1)) / (H2 - H1) with H1 = F (tau + 1) and H2 = F (tau + 2): two
short simulations instead of H steps (500 for DiLoCo), exact to rounding
(tests/test_planner_families.py compares it with the whole period). The planner and bench/families_where.py use
it; `testbed sim` still simulates the whole period (its timeline holds every step).
"""

from __future__ import annotations

from testbed.plan.diloco import resolve as resolve_diloco
from testbed.plan.efficiency import token_efficiency
from testbed.plan.period import DiLoCoPlan
from testbed.sim.choose import build_plan
from testbed.spec.experiment import Experiment
from testbed.spec.mechanisms import parse_scheduler


def timed(exp: Experiment, scheduler: str, dp: int, order: list[str] | None = None, counts: list[int] | None = None,
          lower_bound: bool = False) -> tuple[float, list[int], float]:
    """(seconds per iteration (or its lower bound), the layer split, the token efficiency) of the plan
    build_plan(exp, scheduler, dp, order, counts) gives; SpecError where it cannot be built."""
    mech = parse_scheduler(scheduler)
    d = resolve_diloco(mech.outer, exp.workload.diloco) if mech.outer else None
    if d is None or d.inner_steps < d.fragments * (d.overlap_steps + 2):
        plan = build_plan(exp, scheduler, run_id="period", dp=dp, order=order, counts=counts)
        return _run(plan, lower_bound) / plan.steps_per_program, plan.layers, plan.token_efficiency
    short = [_short(exp, scheduler, d, k, dp, order, counts) for k in (1, 2)]
    eff = token_efficiency(mech.outer, len(short[0].dcs_used()), d, exp.workload.token_efficiency)
    p1, p2 = (_run(p, lower_bound) for p in short)
    h1, h2 = (p.steps_per_program for p in short)
    return (p1 + (d.inner_steps - h1) * (p2 - p1) / (h2 - h1)) / d.inner_steps, short[0].layers, eff


def _run(plan, lower_bound: bool) -> float:
    """One program's simulated time (or its lower bound)."""
    from testbed.runs.simulated import lower_bound_s
    from testbed.sim.executor import simulate

    return lower_bound_s(plan) if lower_bound else simulate(plan)[0].iteration_s[0]


def _short(exp: Experiment, scheduler: str, d: DiLoCoPlan, k: int, dp: int, order: list[str] | None,
           counts: list[int] | None):
    """The plan with d's fragments, bits and overlap and H = F (tau + k) inner steps."""
    spec = {"inner_steps": d.fragments * (d.overlap_steps + k), "fragments": d.fragments,
            "outer_bits": d.outer_bits, "overlap_steps": d.overlap_steps}
    w = exp.workload.model_copy(update={"diloco": exp.workload.diloco.model_copy(update=spec),
                                        "token_efficiency": 1.0})
    return build_plan(exp.model_copy(update={"workload": w}), scheduler, run_id="period", dp=dp, order=order,
                      counts=counts)

"""Low-communication training (DiLoCo, Streaming DiLoCo) as a lowering rule: one program spans one sync period.

Each DC trains its own data-parallel replicas (whole pipelines inside the DC, as dp-wan places them) for H inner
steps: each inner step is the pipeline schedule, the gradient all-reduce among the DC's replicas (a ring inside
the DC) and the inner AdamW step. The DCs then average the outer gradient (how far the parameters moved since
the last sync) over the WAN, hierarchically as NCCL would (reduce-scatter inside each DC, a ring across DCs,
all-gather inside), quantised to `outer_bits` per value: parameters x outer_bits / 8 bytes.

Streaming DiLoCo splits the model into F fragments synced in turn: fragment f's sync starts after inner step
(f + 1) H / F - 1 - tau and must be done before inner step (f + 1) H / F starts, so it overlaps tau inner steps,
and the last fragment's sync ends the period. DiLoCo is the case F = 1, tau = 0: one blocking sync at the end.
Every period is then the same, so one period's program is the steady state. The outer optimizer's step
(Nesterov SGD on a fragment, a few element-wise passes) is not modelled.

Published defaults (docs/families.md): DiLoCo (Douillard et al., 2023, arXiv:2311.08105) H = 500 with the
whole model; Streaming DiLoCo (Douillard et al., 2025, arXiv:2501.18512) H = 100, 4-bit outer gradients,
fragments overlapping tau = 1 inner step.
"""

from __future__ import annotations

from dataclasses import replace

from testbed.errors import SpecError
from testbed.plan.period import DEFAULTS, DiLoCoPlan  # noqa: F401 (re-exported)
from testbed.program import AllReduce, Optimizer, OuterSync, OuterWait
from testbed.timeline import group_name


def resolve(outer: str, spec) -> DiLoCoPlan:
    """`workload.diloco` with the scheduler's defaults filled in, checked; errors name the field."""
    d = DEFAULTS[outer]
    p = DiLoCoPlan(*(getattr(spec, k) if getattr(spec, k) is not None else getattr(d, k)
                     for k in ("inner_steps", "fragments", "outer_bits", "overlap_steps")))
    if spec.fragments is None:  # the default: as many fragments as H and tau leave room for, up to the default's
        fits = [f for f in range(1, d.fragments + 1) if p.inner_steps % f == 0 and p.inner_steps // f > p.overlap_steps]
        p = replace(p, fragments=max(fits, default=1))
    if outer == "diloco" and p.fragments != 1:
        raise SpecError("workload.diloco.fragments", f"diloco syncs the whole model at once, not {p.fragments} "
                        "fragments", "use streaming-diloco, or leave fragments out")
    if outer == "diloco" and p.overlap_steps:
        raise SpecError("workload.diloco.overlap_steps", "diloco's sync blocks the next inner step",
                        "use streaming-diloco, or leave overlap_steps out")
    if p.inner_steps % p.fragments:
        raise SpecError("workload.diloco.fragments", f"{p.fragments} fragments do not divide inner_steps="
                        f"{p.inner_steps} (fragments sync every inner_steps/fragments steps)",
                        "pick fragments dividing inner_steps")
    if p.overlap_steps >= p.inner_steps // p.fragments and outer == "streaming":
        raise SpecError("workload.diloco.overlap_steps", f"overlap_steps={p.overlap_steps} is not below "
                        f"inner_steps/fragments={p.inner_steps // p.fragments} (a fragment's sync must end before "
                        "the next one starts)", "lower overlap_steps or fragments, or raise inner_steps")
    return p


def inner_ring(plan, s: int, r: int) -> tuple[str, ...]:
    """Stage s's groups in replica r's DC: the inner all-reduce's ring."""
    dc = plan.stage_dc[r][s]
    return tuple(group_name(s, q) for q in range(plan.dp) if plan.stage_dc[q][s] == dc)


def period_steps(plan, s: int, r: int, inner, outer) -> list:
    """Group (s, r)'s steps over one sync period: H inner steps (the pipeline schedule with microbatch ids
    h * m + i, the all-reduce among the DC's replicas, the inner optimizer step), each fragment's OuterSync after
    its inner step and its OuterWait before the inner step that needs it. `inner(h)`: inner step h's pipeline
    steps; `outer`: the stage's hierarchical AllReduce across DCs, whose rings and connections the syncs use."""
    d: DiLoCoPlan = plan.diloco
    ring = inner_ring(plan, s, r)
    reduce = AllReduce("ring", plan.grad_bytes[s], (ring,)) if len(ring) > 1 else None
    opt_s = plan.optimizer_s[r][s] if plan.optimizer_s else 0.0
    synced = len(outer.rings) > 1  # replicas in one DC only: nothing to average across DCs
    starts = {d.sync_after(f): f for f in range(d.fragments)} if synced else {}
    waits = {d.wait_before(f) - 1: f for f in range(d.fragments)} if synced else {}
    nbytes = d.outer_bytes(plan.grad_bytes[s])
    steps: list = []
    for h in range(d.inner_steps):
        steps += inner(h)
        if reduce is not None:
            steps.append(reduce)
        steps.append(Optimizer(opt_s))
        if h in starts:
            steps.append(OuterSync(starts[h], nbytes, outer.rings, outer.wan_connections, outer.wan_window_bytes))
        if h in waits:
            steps.append(OuterWait(waits[h]))
    return steps

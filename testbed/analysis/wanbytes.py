"""Bytes that cross the WAN per training iteration, from the lowered programs: one place for every family.

A program's WAN bytes are its Sends on pipes that cross the WAN, and the WAN part of each collective: the
exchanges of an AllReduce (or of an OuterSync, as its hierarchical all-reduce, or of a bucket's reduce-scatter)
whose peer is in another DC.
Summed over every group's program and divided by the training iterations one program runs (H for a sync period
of DiLoCo, else 1): the mean per iteration over a sync period. Real-world bytes (an emulation sends them / k).
"""

from __future__ import annotations

from dataclasses import replace

from testbed.plan.lower import lower_group
from testbed.plan.plan import Plan
from testbed.program import Program, Send, collective_exchanges, ring_collectives


def program_wan_bytes(prog: Program) -> float:
    """The bytes `prog` sends across the WAN in one run of its steps."""
    wan = {p.peer for p in prog.pipes if p.wan is not None}
    total = sum(st.bytes for st in prog.steps if type(st) is Send and st.peer in wan)
    seen: dict[int, float] = {}
    for ar in ring_collectives(prog.steps):
        key = id(ar)  # one lowering shares a step object between its repeats: count its exchanges once each
        if key not in seen:
            local = next(r for r in ar.rings if prog.group in r)
            seen[key] = sum(ex.bytes for ex in collective_exchanges(ar, prog.group) if ex.send_to not in local)
        total += seen[key]
    return total


def wan_bytes(plan: Plan) -> float:
    """Bytes across the WAN per iteration, every group's program counted. Groups of one stage whose replicas sit
    in the same DCs have programs that differ only in their replica's name (plan/lower.py), so one is lowered
    per (stage, placement row)."""
    if plan.ideal_wan:
        return 0.0
    lowered = plan
    if plan.diloco is not None:  # inner steps send nothing across the WAN: a period with one per sync lowers as fast
        d = plan.diloco
        lowered = replace(plan, diloco=replace(d, inner_steps=d.fragments * (d.overlap_steps + 1)))
    per_shape: dict[tuple, float] = {}
    total = 0.0
    for r in range(plan.dp):
        row = tuple(plan.stage_dc[r])
        for s in range(plan.pp):
            key = (s, row, plan.microbatches_of(r))
            if key not in per_shape:
                per_shape[key] = program_wan_bytes(lower_group(lowered, s, r))
            total += per_shape[key]
    return total / plan.steps_per_program

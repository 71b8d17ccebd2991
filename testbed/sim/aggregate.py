"""The aggregated simulation: past the size the full event simulation takes in seconds, replicas that take
turns on the WAN are simulated in blocks, so the work grows with the number of distinct program shapes and link
states, not with the GPUs.

Under temporal sharing (Atlas) every replica takes its own turns on a link, in the plan's turn order, so the full
simulation runs each one (sim/executor.py `replica_classes`). Replicas with the same placement and costs that
are consecutive in the turn order take their turns one after another; a block of c of them is simulated as its
first replica standing for c copies (a flow of weight c, testbed/sim/network.py): the block's transfers on a
link carry its c replicas' bytes at the link's full rate, one turn of the block in place of c consecutive turns.
The link carries the same bytes in the same order and is busy as long; what moves is where inside the block's
turn each replica's transfer ends (all at its end, not one after another), at most (c - 1) turns of one
transfer each, against iterations of thousands of turns where the WAN is the bottleneck
(docs/simulator-speed.md measures the difference). The block starts at its first replica's start offset.

Below FULL_STAGE_MICROBATCHES the full simulation runs (every shipped experiment: byte-identical outputs);
above it blocks are sized so that about AGGREGATED_STAGE_MICROBATCHES are simulated.
"""

from __future__ import annotations

import math

from testbed.plan.plan import MAX_STAGE_MICROBATCHES, Plan

# (replica, stage, microbatch) triples the full event simulation runs when every replica is its own: 250,000 holds
# a 110,592-GPU job (dp 864, pp 16, 16 microbatches) in about 5 CPU seconds for Atlas
FULL_STAGE_MICROBATCHES = MAX_STAGE_MICROBATCHES
# what the aggregated simulation runs at most: blocks of 16 at 1,048,576 GPUs, about 2 CPU seconds for Atlas
# (bench/sim_scale.py), and within about 1 % of the full simulation's iteration where both run
AGGREGATED_STAGE_MICROBATCHES = 131_072


def stage_microbatches(plan: Plan, replicas: int) -> int:
    """(replica, stage, microbatch) triples a simulation of `replicas` replicas runs per program."""
    return replicas * plan.pp * plan.microbatches * plan.steps_per_program


def turn_block(plan: Plan) -> int:
    """Consecutive replicas in the turn order simulated as one: 1 (the full simulation) up to
    FULL_STAGE_MICROBATCHES, else enough that about AGGREGATED_STAGE_MICROBATCHES are simulated."""
    if stage_microbatches(plan, plan.dp) <= FULL_STAGE_MICROBATCHES:
        return 1
    return math.ceil(stage_microbatches(plan, plan.dp) / AGGREGATED_STAGE_MICROBATCHES)


def _shape(plan: Plan, r: int) -> tuple:
    """What a replica's timeline depends on besides its start offset and its place in the turns."""
    return (tuple(plan.stage_dc[r]), tuple(plan.fwd_s[r]), tuple(plan.bwd_s[r]), plan.microbatches_of(r))


def turn_blocks(plan: Plan, block: int) -> dict[int, list[int]]:
    """Replica -> the replicas it stands for: runs of up to `block` replicas consecutive in the turn order with the
    same placement and costs (a different one starts a new run), each led by its first in the turn order."""
    out: dict[int, list[int]] = {}
    lead, prev = -1, None
    for r in plan.turn_order:
        shape = _shape(plan, r)
        if lead < 0 or shape != prev or len(out[lead]) >= block:
            lead = r
            out[lead] = []
        out[lead].append(r)
        prev = shape
    return dict(sorted(out.items()))

"""Token efficiency: how many tokens synchronous training needs for a loss, over how many this plan's family
needs (1: as good; 0.8: it needs 25 % more tokens). An explicit input, so families whose steps are cheaper but
learn less per token are compared by `effective_tokens_per_s` = tokens/s x efficiency (docs/families.md).

Defaults come from published results, only inside the range they were measured in; outside it the user says
(`workload.token_efficiency`), rather than the testbed inventing a number:

- synchronous training (every pipeline and data-parallel scheduler): 1 by definition.
- DiLoCo (Douillard et al., 2023, arXiv:2311.08105): "on 8 workers performs as well as fully synchronous
  optimization while communicating 500 times less" (C4, H = 500): 1 up to 8 DCs and H <= 500.
- Streaming DiLoCo (Douillard et al., 2025, arXiv:2501.18512): overlapped fragment syncs with 4-bit outer
  gradients kept learning quality similar to data parallelism: 1 for 4 bits or more and tau <= 5.
"""

from __future__ import annotations

from testbed.errors import SpecError
from testbed.plan.diloco import DiLoCoPlan

MAX_DCS, MAX_INNER_STEPS, MIN_OUTER_BITS, MAX_OVERLAP_STEPS = 8, 500, 4, 5  # the published range of the defaults


def token_efficiency(outer: str, dcs: int, d: DiLoCoPlan | None, override: float | None) -> float:
    """The plan's token efficiency: `override` (workload.token_efficiency) if given, else the family's default."""
    if override is not None:
        return float(override)
    if not outer or d is None:
        return 1.0
    out = []
    if dcs > MAX_DCS:
        out.append(f"{dcs} DCs (published: up to {MAX_DCS})")
    if d.inner_steps > MAX_INNER_STEPS:
        out.append(f"inner_steps={d.inner_steps} (published: up to {MAX_INNER_STEPS})")
    if d.outer_bits < MIN_OUTER_BITS:
        out.append(f"outer_bits={d.outer_bits} (published: {MIN_OUTER_BITS} or more)")
    if d.overlap_steps > MAX_OVERLAP_STEPS:
        out.append(f"overlap_steps={d.overlap_steps} (published: up to {MAX_OVERLAP_STEPS})")
    if out:
        raise SpecError("workload.token_efficiency", f"no published token efficiency for {', '.join(out)}",
                        "set workload.token_efficiency (tokens synchronous training needs / tokens this needs)")
    return 1.0

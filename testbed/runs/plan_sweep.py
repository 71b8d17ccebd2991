"""`testbed plan --sweep`: the planner's search at every sweep point, each point keeping the plans of the points
before it in play, so a plan that was best with less of a resource is simulated again with more (more WAN
capacity can then never yield a worse best plan, unless the same layout itself runs slower)."""

from __future__ import annotations

from collections.abc import Callable

from testbed.runs.select import Search, search
from testbed.spec.experiment import Experiment


def search_points(points: list[tuple[Experiment, dict]], scheduler: str, top: int, tps: list[int] | None,
                  pps: list[int] | None, microbatch_sizes: list[int] | None, jobs: int | None,
                  families: list[str], on_point: Callable[[int, Search], None] | None = None
                  ) -> list[tuple[dict, Search]]:
    """(sweep point, search) for every point, in order."""
    keep: set[tuple[str, tuple]] = set()
    out: list[tuple[dict, Search]] = []
    for i, (exp, point) in enumerate(points):
        res = search(exp, scheduler, top, tps, pps, microbatch_sizes, jobs, families, sorted(keep))
        keep |= {(s.family, s.best.key()) for s in res.sets if s.best is not None}
        out.append((point, res))
        if on_point is not None:
            on_point(i, res)
    return out

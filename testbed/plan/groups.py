"""Hybrids (`workload.groups`): a pipeline inside each group of DCs, data parallelism or DiLoCo across the groups.

A data-parallel family (dp-wan, dp-wan-overlap, diloco, streaming-diloco) places whole replicas inside one DC;
with groups it places each replica's pipeline over one group's DCs instead, stages split evenly over them in the
listed order (as pp-wan splits them: consecutive stages per DC, each stage's tp x replicas GPUs inside one DC).
Every replica of a group runs the same chain, so stage s of a group sits in one DC, and the lowering needs no new
rule: stage s's gradient all-reduce (or outer sync) is hierarchical over the DCs that hold stage s in some group
(plan/lower.py `allreduce`), the pipeline's messages cross the WAN inside a group as any pipeline's do, and
DiLoCo's inner all-reduce is a ring inside the DC that holds the group's stage. A group of one DC is dp-wan's
whole pipelines in that DC.
"""

from __future__ import annotations

import itertools
import math

from testbed.errors import SpecError
from testbed.spec.topology import Topology

StageDC = list[list[str]]  # [replica][stage] -> DC name


def split_replicas(dp: int, fits: list[int]) -> tuple[int, ...] | None:
    """dp whole replicas over places that fit `fits` each, in proportion to their room (largest remainder, ties
    to the earlier one), at least one each; None if they cannot."""
    if dp < len(fits) or dp > sum(fits) or min(fits) < 1:
        return None
    quota = [dp * f / sum(fits) for f in fits]
    counts = [max(1, min(f, int(q))) for f, q in zip(fits, quota, strict=True)]
    while sum(counts) < dp:  # the largest remainder that has room gets one more
        i = min((i for i in range(len(fits)) if counts[i] < fits[i]), key=lambda i: (counts[i] - quota[i], i))
        counts[i] += 1
    while sum(counts) > dp:  # (the floor of one raised it) the smallest remainder above one gives one back
        i = max((i for i in range(len(fits)) if counts[i] > 1), key=lambda i: (counts[i] - quota[i], -i))
        counts[i] -= 1
    return tuple(counts)


def stage_counts(n_dcs: int, pp: int) -> list[int]:
    """Stages per DC of a group's chain: ceil(pp / DCs) each in order, the last ones what is left (maybe none)."""
    share = math.ceil(pp / n_dcs)
    return [max(0, min(share, pp - share * i)) for i in range(n_dcs)]


def group_room(topo: Topology, dcs: list[str], pp: int, tp: int) -> int:
    """The most replicas whose pipelines, split evenly over the group's DCs, the group holds."""
    return min(topo.dc(d).gpus // (tp * c) for d, c in zip(dcs, stage_counts(len(dcs), pp), strict=True) if c)


def check_groups(topo: Topology, groups: dict[str, list[str]]) -> None:
    """Known DCs, each in one group at most, consecutive DCs of a group linked; else the one-line error."""
    names = [d.name for d in topo.dcs]
    seen: set[str] = set()
    for g, dcs in groups.items():
        if not dcs:
            raise SpecError("workload.groups", f"group {g!r} has no DC", "list its DCs in pipeline order")
        for d in dcs:
            if d not in names:
                raise SpecError("workload.groups", f"group {g!r}: unknown DC {d!r}",
                                f"use DCs of the topology: {', '.join(names)}")
            if d in seen:
                raise SpecError("workload.groups", f"DC {d!r} is in two groups", "put each DC in one group")
            seen.add(d)


def place_groups(topo: Topology, groups: dict[str, list[str]], pp: int, tp: int, dp: int) -> StageDC:
    """[replica][stage] -> DC: dp replicas split over the groups by their room, each a pipeline over its group's
    DCs; refused where they do not fit or a stage's DCs are not linked for its all-reduce."""
    check_groups(topo, groups)
    orders = list(groups.values())
    rooms = [group_room(topo, dcs, pp, tp) for dcs in orders]
    counts = split_replicas(dp, rooms)
    if counts is None:
        raise SpecError("workload.groups", f"the groups {', '.join(groups)} hold {rooms} replicas of tp*pp="
                        f"{tp * pp} GPUs (at least one each), not dp={dp}", "set dp to fit them, or lower tp or pp")
    out: StageDC = []
    for dcs, n in zip(orders, counts, strict=True):
        row = [d for d, c in zip(dcs, stage_counts(len(dcs), pp), strict=True) for _ in range(c)]
        for a, b in itertools.pairwise(dict.fromkeys(row)):
            if topo.link(a, b) is None:
                raise SpecError("topology.links", f"a group's pipeline goes {a} -> {b} but no WAN link joins them",
                                f"add a link between {a} and {b}, or reorder the group")
        out += [list(row) for _ in range(n)]
    for s in range(pp):
        dcs = sorted({row[s] for row in out}, key=[d.name for d in topo.dcs].index)
        for a, b in itertools.combinations(dcs, 2):
            if topo.link(a, b) is None:
                raise SpecError("topology.links", f"stage {s}'s all-reduce across the groups joins {a} and {b}, "
                                "which no link joins", f"add a link between {a} and {b}")
    return out

"""The families the planner compares, and the layouts of the data-parallel ones.

A family is one way to train across DCs, scored by one scheduler:

| family | scheduler | layout |
|---|---|---|
| pipeline | atlas | stages across the DCs of a chain (select.layouts) |
| dp-wan | dp-wan | whole pipelines in every DC, Megatron-Core's distributed optimizer across DCs |
| diloco | diloco | whole pipelines in every DC, the outer gradient averaged every H steps |
| streaming-diloco | streaming-diloco | the same, fragments synced in turn under the inner steps |
| hybrid | dp-wan | a pipeline over each group of DCs (`workload.groups`), dp-wan's optimizer across the groups |

The data-parallel families need two DCs or more (in one DC they are the pipeline family's one-site layout); a
hybrid needs three or more, in groups of one or two DCs (a pipeline over two nearby DCs, whole pipelines in
the others), at least one group of two: larger groups and DiLoCo across groups are simulated with
`testbed sim --set workload.groups=...`, not searched.
"""

from __future__ import annotations

import itertools
import math

from testbed.costs.models import resolve_model
from testbed.errors import SpecError
from testbed.plan.build import divisors_desc
from testbed.plan.estimate import Layout
from testbed.plan.groups import group_room, split_replicas, stage_counts
from testbed.spec.experiment import Experiment
from testbed.spec.topology import Topology

FAMILIES: dict[str, str] = {  # family -> the scheduler that scores it
    "pipeline": "atlas",
    "dp-wan": "dp-wan",
    "diloco": "diloco",
    "streaming-diloco": "streaming-diloco",
    "hybrid": "dp-wan",
}


def parse_families(text: str | None) -> list[str]:
    """`--families a,b` (default: every family), checked."""
    if not text:
        return list(FAMILIES)
    out = [f.strip() for f in text.split(",") if f.strip()]
    for f in out:
        if f not in FAMILIES:
            raise SpecError("--families", f"unknown family {f!r}", f"use some of {', '.join(FAMILIES)}")
    return out


def dc_sets(topo: Topology) -> list[tuple[str, ...]]:
    """Every set of two or more DCs, in topology order, whose every pair is linked (DP's ring and all-reduce)."""
    names = [d.name for d in topo.dcs]
    return [s for k in range(2, len(names) + 1) for s in itertools.combinations(names, k)
            if all(topo.link(a, b) for a, b in itertools.combinations(s, 2))]


def dp_layouts(exp: Experiment, tps: list[int] | None, pps: list[int] | None, microbatch_sizes: list[int] | None,
               mbs_default: tuple[int, ...], max_layouts: int = 400_000) -> list[tuple[Layout | None, tuple, str]]:
    """Every (DC set, tp, microbatch, pp) of a data-parallel family with its largest dp dividing the batch:
    (layout, key, "") or (None, key, why); `Layout.counts` are replicas per DC."""
    topo, w = exp.topology, exp.workload
    model = resolve_model(w.model, w.seq_len)
    mbs = microbatch_sizes or [b for b in mbs_default if w.global_batch % b == 0]
    out: list[tuple[Layout | None, tuple, str]] = []
    sets = dc_sets(topo)
    most = len(sets) * len(mbs) * (len(tps) if tps else 8) * (len(pps) if pps else model.layers)
    if most > max_layouts:
        raise SpecError("topology.dcs", f"{len(sets):,} DC sets x tp x pp x microbatch sizes give up to {most:,} "
                        f"data-parallel layouts to estimate (at most {max_layouts:,})",
                        "pin --tp, --pp or --microbatch, list fewer candidate DCs, or --families pipeline")
    for order in sets:
        dcs = [topo.dc(n) for n in order]
        gpn = math.gcd(*[d.gpus_per_node for d in dcs])
        for tp in tps or [t for t in range(1, gpn + 1) if gpn % t == 0]:
            if model.heads % tp or model.kv_heads % tp or gpn % tp:
                continue
            for mb in mbs:
                for pp in sorted(pps or range(1, model.layers + 1)):
                    key = (order, tp, pp, mb)
                    fits = [d.gpus // (tp * pp) for d in dcs]
                    if min(fits) < 1:
                        out.append((None, key, f"a whole pipeline of tp*pp={tp * pp} GPUs does not fit every DC"))
                        continue
                    dp = next((d for d in divisors_desc(w.global_batch // mb, sum(fits)) if d >= len(order)), 0)
                    counts = split_replicas(dp, fits) if dp else None
                    if counts is None:
                        out.append((None, key, f"no dp dividing {w.global_batch // mb} sequences gives every DC a "
                                               f"whole replica"))
                        continue
                    out.append((Layout(order, counts, tp, pp, dp, mb), key, ""))
    return out


def pairings(dcs: tuple[str, ...]) -> list[list[tuple[str, ...]]]:
    """Every way to cut `dcs` into groups of one or two DCs with at least one pair and two groups or more, each
    pair in both pipeline orders; groups in the order of their first DC in `dcs`."""
    def cuts(rest: tuple[str, ...]) -> list[list[tuple[str, ...]]]:
        if not rest:
            return [[]]
        head, tail = rest[0], rest[1:]
        out = [[(head,), *c] for c in cuts(tail)]
        for i, other in enumerate(tail):
            for c in cuts(tail[:i] + tail[i + 1:]):
                out += [[(head, other), *c], [(other, head), *c]]
        return out

    return [c for c in cuts(dcs) if len(c) >= 2 and any(len(g) == 2 for g in c)]


def hybrid_layouts(exp: Experiment, tps: list[int] | None, pps: list[int] | None,
                   microbatch_sizes: list[int] | None, mbs_default: tuple[int, ...], max_layouts: int = 400_000
                   ) -> list[tuple[Layout | None, tuple, str]]:
    """Every (DC set of 3+, grouping, tp, microbatch, pp) of the hybrid family with its largest dp dividing the
    batch that the groups hold: `Layout.groups` cuts `order` into the groups, `Layout.counts` are replicas per
    group (split by room, as testbed/plan/groups.py places them)."""
    topo, w = exp.topology, exp.workload
    model = resolve_model(w.model, w.seq_len)
    mbs = microbatch_sizes or [b for b in mbs_default if w.global_batch % b == 0]
    ways = [(order, g) for order in dc_sets(topo) if len(order) >= 3 for g in pairings(order)]
    most = len(ways) * len(mbs) * (len(tps) if tps else 8) * (len(pps) if pps else model.layers)
    if most > max_layouts:
        raise SpecError("topology.dcs", f"{len(ways):,} groupings of DC sets x tp x pp x microbatch sizes give up to "
                        f"{most:,} hybrid layouts to estimate (at most {max_layouts:,})",
                        "pin --tp, --pp or --microbatch, list fewer candidate DCs, or leave hybrid out of --families")
    out: list[tuple[Layout | None, tuple, str]] = []
    for order, groups in ways:
        flat = tuple(d for g in groups for d in g)
        sizes = tuple(len(g) for g in groups)
        gpn = math.gcd(*[topo.dc(n).gpus_per_node for n in order])
        for tp in tps or [t for t in range(1, gpn + 1) if gpn % t == 0]:
            if model.heads % tp or model.kv_heads % tp or gpn % tp:
                continue
            for mb in mbs:
                for pp in sorted(pps or range(2, model.layers + 1)):
                    key = (flat, tp, pp, mb, sizes)
                    if pp < 2 or min(min(stage_counts(len(g), pp)) for g in groups) < 1:
                        out.append((None, key, f"pp={pp} leaves a DC of a two-DC group without a stage"))
                        continue
                    rooms = [group_room(topo, list(g), pp, tp) for g in groups]
                    dp = next((d for d in divisors_desc(w.global_batch // mb, sum(rooms)) if d >= len(groups)), 0)
                    counts = split_replicas(dp, rooms) if dp and min(rooms) >= 1 else None
                    if counts is None:
                        out.append((None, key, f"no dp dividing {w.global_batch // mb} sequences gives every group "
                                               f"a whole pipeline of tp*pp={tp * pp} GPUs per stage DC"))
                        continue
                    out.append((Layout(flat, counts, tp, pp, dp, mb, sizes), key, ""))
    return out

"""Placement: which DC hosts each (replica, stage) group. Never touches the network."""

from __future__ import annotations

import math

from testbed.errors import SpecError
from testbed.plan.groups import place_groups
from testbed.spec.mechanisms import Placement
from testbed.spec.topology import Topology

StageDC = list[list[str]]  # [replica][stage] -> DC name


def dcs_by_free_gpus(topo: Topology) -> list[str]:
    """Atlas orders DCs by free GPUs, most first (ties keep the topology's order)."""
    return [d.name for d in sorted(topo.dcs, key=lambda d: -d.gpus)]


def atlas_chain(topo: Topology, pp: int, tp: int, dp: int) -> list[str]:
    """Atlas's DC chain: the chains that fit the pipeline (stages filled greedily in chain order, every DC in
    it used, consecutive DCs linked), best first by their thinnest link's capacity, then fewer DCs, then less
    latency along the chain, then the DCs with the most free GPUs first. Ordering by free GPUs alone put a
    thin link between the two largest DCs in the pipeline's path when a third DC joined both by fat links."""
    by_free = dcs_by_free_gpus(topo)
    per_stage = tp * dp
    cap = {n: topo.dc(n).gpus // per_stage for n in by_free}
    rank = {n: i for i, n in enumerate(by_free)}
    best: tuple | None = None
    best_chain = by_free

    def visit(chain: list[str], stages: int, thinnest: float, latency: float) -> None:
        nonlocal best, best_chain
        if stages >= pp:
            key = (-thinnest, len(chain), latency, [rank[n] for n in chain])
            if best is None or key < best:
                best, best_chain = key, list(chain)
            return
        for n in by_free:
            if n in chain or cap[n] == 0:
                continue
            link = topo.link(chain[-1], n) if chain else None
            if chain and link is None:
                continue
            chain.append(n)
            visit(chain, stages + cap[n], min(thinnest, link.gbps) if link else thinnest,
                  latency + (link.latency_ms if link else 0.0))
            chain.pop()

    if len(by_free) <= 8:
        visit([], 0, float("inf"), 0.0)
    return best_chain + [n for n in by_free if n not in best_chain]


def chain_stages(order: list[str], topo: Topology, pp: int, tp: int, dp: int, *, even: bool,
                 counts: list[int] | None = None) -> list[str]:
    """Stage -> DC: consecutive stages per DC, each stage's tp*dp GPUs inside one DC. `counts` pins
    how many stages each DC of `order` runs (the planner's choice)."""
    per_stage = tp * dp
    caps = [topo.dc(n).gpus // per_stage for n in order]
    if counts is not None:
        if len(counts) != len(order) or sum(counts) != pp:
            raise SpecError("plan", f"stage counts {counts} do not give {pp} stages over {len(order)} DCs",
                            "give one count per DC, summing to pp")
        for name, c, cap in zip(order, counts, caps, strict=True):
            if c > cap:
                raise SpecError("plan", f"DC {name} fits {cap} stages of {per_stage} GPUs, not {c}",
                                "lower the stage count, dp or tp")
    elif even:
        share = math.ceil(pp / len(order))
        counts = [min(share, pp - share * i) for i in range(len(order))]
        counts = [max(c, 0) for c in counts]
        for name, c, cap in zip(order, counts, caps, strict=True):
            if c > cap:
                raise SpecError(
                    "workload",
                    f"pp-wan splits {pp} stages evenly ({c} per DC) but DC {name} fits {cap} stages "
                    f"of {per_stage} GPUs",
                    "lower workload.dp or workload.tp, or give that DC more GPUs",
                )
    else:
        counts, left = [], pp
        for cap in caps:
            counts.append(min(cap, left))
            left -= counts[-1]
        if left:
            raise SpecError(
                "workload",
                f"{pp} stages of tp*dp={per_stage} GPUs need {pp * per_stage} GPUs; the DCs fit "
                f"{sum(caps)} stages",
                "lower workload.dp, workload.tp or workload.pp, or add GPUs",
            )
    stages = [name for name, c in zip(order, counts, strict=True) for _ in range(c)]
    used = [n for n, c in zip(order, counts, strict=True) if c]
    for a, b in zip(used, used[1:], strict=False):
        if topo.link(a, b) is None:
            raise SpecError("topology.links", f"the pipeline goes {a} -> {b} but no WAN link joins them",
                            f"add a link between {a} and {b}")
    return stages


def pinned_replicas(topo: Topology, pp: int, tp: int, dp: int, order: list[str], counts: list[int]) -> StageDC:
    """Whole replicas (pipelines of pp stages) per DC as pinned: counts[i] in order[i]."""
    if len(counts) != len(order) or sum(counts) != dp:
        raise SpecError("workload.replicas_per_dc", f"replica counts {counts} do not give dp={dp} replicas over "
                        f"{len(order)} DCs", "give one count per DC, summing to dp")
    for name, c in zip(order, counts, strict=True):
        fit = topo.dc(name).gpus // (tp * pp)
        if c > fit:
            raise SpecError("workload.replicas_per_dc", f"DC {name} fits {fit} replicas of tp*pp={tp * pp} GPUs, "
                            f"not {c}", "lower its replica count, tp or pp")
    return [[name] * pp for name, c in zip(order, counts, strict=True) for _ in range(c)]


def place(kind: Placement, topo: Topology, pp: int, tp: int, dp: int, order: list[str] | None = None,
          counts: list[int] | None = None, groups: dict[str, list[str]] | None = None) -> StageDC:
    """[replica][stage] -> DC. `groups` (data-parallel placement only): a pipeline over each group's DCs
    (testbed/plan/groups.py) instead of whole replicas inside each DC."""
    if kind == "dp-wan" and groups:
        return place_groups(topo, groups, pp, tp, dp)
    if kind == "dp-wan":
        per_replica = tp * pp
        out: StageDC = []
        if counts is not None:
            out = pinned_replicas(topo, pp, tp, dp, order or [], counts)
        for name in dcs_by_free_gpus(topo) if counts is None else []:
            fit = topo.dc(name).gpus // per_replica
            out += [[name] * pp for _ in range(min(fit, dp - len(out)))]
        if len(out) < dp:
            raise SpecError(
                "workload.dp",
                f"dp-wan keeps whole pipelines (tp*pp={per_replica} GPUs) inside a DC; the DCs fit "
                f"{len(out)} of {dp} replicas",
                "lower workload.dp or workload.pp",
            )
        dcs_used = sorted({r[0] for r in out}, key=[d.name for d in topo.dcs].index)
        for i, a in enumerate(dcs_used):
            for b in dcs_used[i + 1 :]:
                if topo.link(a, b) is None:
                    raise SpecError("topology.links", f"dp-wan all-reduces over every DC pair; {a}-{b} has no link",
                                    f"add a link between {a} and {b}")
        return out
    if order is None:
        order = atlas_chain(topo, pp, tp, dp) if kind == "atlas" else [d.name for d in topo.dcs]
    stages = chain_stages(order, topo, pp, tp, dp, even=(kind == "pp-even"), counts=counts)
    return [list(stages) for _ in range(dp)]

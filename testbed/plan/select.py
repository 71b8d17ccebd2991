"""DC selection: which DCs, in which pipeline order, how many stages and replicas each.

Candidates are every subset of DCs and every chain order through it whose consecutive DCs share a
WAN link (all orders up to 5 DCs, nearest-neighbour chains from each start beyond). Each gets the
largest DP degree whose stages (tp*dp GPUs each, consecutive per DC) fit. A quick analytic bound
ranks them; the simulator, the objective function, scores the best `simulate_top`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from testbed.errors import SpecError
from testbed.plan.build import build_plan, divisors_desc
from testbed.plan.placement import chain_stages
from testbed.sim.run import lower_bound_s
from testbed.spec.experiment import Experiment


@dataclass
class Candidate:
    order: tuple[str, ...]
    dp: int = 0
    stages: str = ""  # e.g. "useast:4 uscentral:4"
    gpus: int = 0
    estimate_s: float = 0.0
    iteration_s: float = 0.0
    tokens_per_s: float = 0.0
    tokens_per_s_per_gpu: float = 0.0
    lower_bound_s: float = 0.0
    status: str = ""  # "best", "simulated", "estimated", or why it was rejected


MAX_CHAINS = 20_000  # each candidate is fitted and estimated (a plan each): about 20 s here at this bound


def chain_count(n: int) -> int:
    """Orders `chains` enumerates for n DCs (before dropping unlinked ones): all up to 5 DCs, n per subset beyond."""
    return sum(math.perm(n, k) if k <= 5 else math.comb(n, k) * k for k in range(1, n + 1))


def chains(exp: Experiment) -> list[tuple[str, ...]]:
    topo = exp.topology
    names = [d.name for d in topo.dcs]
    if chain_count(len(names)) > MAX_CHAINS:
        fit = max(n for n in range(1, len(names)) if chain_count(n) <= MAX_CHAINS)
        raise SpecError("topology.dcs", f"{len(names)} candidate DCs give {chain_count(len(names)):,} DC chains to "
                        f"score", f"list at most {fit} candidate DCs")
    out: list[tuple[str, ...]] = []
    kept: set[tuple[str, ...]] = set()
    for k in range(1, len(names) + 1):
        for subset in itertools.combinations(names, k):
            if k <= 5:
                orders = itertools.permutations(subset)
            else:
                orders = (_nearest_chain(exp, subset, start) for start in subset)
            for o in orders:
                if o[::-1] in kept and len(o) > 1 and all(
                        topo.dc(a).gpus == topo.dc(b).gpus for a, b in zip(o, o[::-1], strict=True)):
                    continue  # a mirror of a symmetric chain scores the same
                if all(topo.link(a, b) for a, b in zip(o, o[1:], strict=False)):
                    out.append(tuple(o))
                    kept.add(tuple(o))
    return out


def _nearest_chain(exp: Experiment, subset: tuple[str, ...], start: str) -> tuple[str, ...]:
    left, chain = set(subset) - {start}, [start]
    while left:
        nxt = min(left, key=lambda n: (exp.topology.link(chain[-1], n).latency_ms  # type: ignore[union-attr]
                                       if exp.topology.link(chain[-1], n) else 1e9, n))
        chain.append(nxt)
        left.remove(nxt)
    return tuple(chain)


def fit(exp: Experiment, c: Candidate) -> None:
    w = exp.workload
    gpus = sum(exp.topology.dc(d).gpus for d in c.order)
    for dp in divisors_desc(w.global_batch // w.microbatch, gpus // (w.tp * w.pp)):
        try:
            stages = chain_stages(list(c.order), exp.topology, w.pp, w.tp, dp, even=False)
        except SpecError:
            continue
        if len(set(stages)) < len(c.order):
            c.status = "rejected: a DC in the chain gets no stage"
            return
        c.dp, c.gpus = dp, w.tp * w.pp * dp
        c.stages = " ".join(f"{d}:{stages.count(d)}" for d in c.order)
        return
    c.status = f"rejected: does not fit ({w.pp} stages of tp={w.tp} GPUs in {gpus:,} GPUs, whole stages per DC)"


def estimate(exp: Experiment, c: Candidate) -> None:
    """Analytic iteration time: max of the 1F1B compute bound and the busiest WAN hop's bytes/rate,
    plus the fill/drain latency of the WAN hops."""
    plan = build_plan(exp, "atlas", dp=c.dp, order=list(c.order))
    f = max(plan.fwd_s[0]) + max(plan.bwd_s[0])
    compute = (plan.microbatches + plan.pp - 1) * f
    row = plan.stage_dc[0]
    hops = [(a, b) for a, b in zip(row, row[1:], strict=False) if a != b]
    wan = max((plan.dp * plan.microbatches * plan.act_bytes[0] /
               min(plan.links[h].capacity_bps, plan.dp * plan.links[h].transfer_cap_bps) for h in hops), default=0)
    c.estimate_s = max(compute, wan) + 2 * sum(plan.links[h].latency_s for h in hops)


def select_dcs(exp: Experiment, simulate_top: int = 8) -> list[Candidate]:
    from testbed.sim.executor import simulate

    cands = [Candidate(o) for o in chains(exp)]
    for c in cands:
        fit(exp, c)
        if not c.status:
            try:
                estimate(exp, c)
                c.status = "estimated"
            except SpecError as e:
                c.status = f"rejected: {e.problem}"
    ok = sorted((c for c in cands if c.status == "estimated"), key=lambda c: (c.estimate_s, -c.gpus, c.order))
    for c in ok[:simulate_top]:
        plan = build_plan(exp, "atlas", run_id="-".join(c.order), dp=c.dp, order=list(c.order))
        tl, _ = simulate(plan)
        c.iteration_s = tl.iteration_s[0]
        c.lower_bound_s = lower_bound_s(plan)
        c.tokens_per_s = plan.global_batch * plan.seq_len / c.iteration_s
        c.tokens_per_s_per_gpu = c.tokens_per_s / c.gpus
        c.status = "simulated"
    for c in ok[simulate_top:]:
        c.status = "rejected: ranked below the simulated top by the analytic estimate"
    sim = sorted((c for c in cands if c.status == "simulated"), key=lambda c: (-c.tokens_per_s, c.order))
    if sim:
        sim[0].status = "best"
    rest = [c for c in cands if c.status not in ("best", "simulated")]
    return sim + sorted(rest, key=lambda c: (c.estimate_s or float("inf"), c.order))

"""The planner: which DCs, in which pipeline order, with which tp, pp, dp and microbatch size.

Every chain of DCs (every subset, every order up to 5 DCs; mirrored chains of identical DCs once) x
tp x microbatch size x pp is a layout: it gets the largest dp whose stages (tp*dp GPUs each,
consecutive per DC) fit, the extra stages going to the fastest and largest DCs, and its layers
balanced by GPU speed and memory. The analytic estimate (estimate.py) ranks the layouts that fit in
memory; the simulator, the objective, scores the best `top` of every DC set. So each set's answer
(one site or several) is a simulated one, and adding a DC to the topology only adds candidates: the
chosen plan never gets slower.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from testbed.costs.gpus import GPUS
from testbed.costs.models import resolve_model
from testbed.errors import SpecError
from testbed.plan.build import build_plan, divisors_desc
from testbed.plan.estimate import Estimator, Layout
from testbed.plan.mechanisms import parse_scheduler
from testbed.results import fmt
from testbed.spec.experiment import Experiment
from testbed.spec.topology import DC, Topology

MICROBATCHES = (1, 2, 4, 8)  # microbatch sizes searched unless pinned


@dataclass
class Candidate:
    layout: Layout
    dcs: str  # the DC set, in topology order: "useast|uswest"
    gpus: int
    idle_gpus: int  # free GPUs of the DC set this layout leaves unused
    microbatches: int
    layers: list[int]
    mem_gb: float
    estimate_s: float
    iteration_s: float | None = None
    lower_bound_s: float | None = None
    status: str = "estimated"
    tokens: int = 0  # tokens per iteration

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.iteration_s if self.iteration_s else None

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        t = self.tokens_per_s
        return t / self.gpus if t is not None else None

    def key(self) -> tuple:
        lay = self.layout
        return (lay.order, lay.tp, lay.pp, lay.microbatch)


@dataclass
class SetResult:
    dcs: str
    free_gpus: int
    best: Candidate | None
    problem: str = ""  # why nothing in this set fits, when best is None


@dataclass
class Search:
    candidates: list[Candidate]
    sets: list[SetResult]
    best: Candidate | None
    scheduler: str
    simulated: int = 0
    wall_s: float = 0.0
    estimate_wall_s: float = 0.0

    @property
    def layouts(self) -> int:
        return len(self.candidates)

    @property
    def fit(self) -> int:
        return sum(1 for c in self.candidates if not c.status.startswith("rejected"))


def dc_signature(d: DC) -> tuple:
    """Everything about a DC that the simulator sees (its name and emulated host count aside)."""
    return tuple(sorted((k, v) for k, v in d.model_dump().items() if k not in ("name", "hosts")))


MAX_CHAINS = 20_000  # orders enumerated before dropping unlinked ones (12 DCs would give 10^5)
MAX_LAYOUTS = 400_000  # each is estimated (about 0.1-0.3 ms here): about a minute at this bound


def chain_count(n: int) -> int:
    """Orders `chains` enumerates for n DCs (before dropping unlinked ones): all up to 5 DCs, n per subset beyond."""
    return sum(math.perm(n, k) if k <= 5 else math.comb(n, k) * k for k in range(1, n + 1))


def chains(topo: Topology) -> list[tuple[str, ...]]:
    """Pipeline orders of every DC subset that the WAN links connect. A chain whose mirror image has
    identical DCs at every position (same GPUs, counts and fabric) scores the same and is listed once."""
    names = [d.name for d in topo.dcs]
    if chain_count(len(names)) > MAX_CHAINS:
        fit = max(n for n in range(1, len(names)) if chain_count(n) <= MAX_CHAINS)
        raise SpecError("topology.dcs", f"{len(names)} candidate DCs give {chain_count(len(names)):,} DC chains to "
                        f"score", f"list at most {fit} candidate DCs")
    sig = {d.name: dc_signature(d) for d in topo.dcs}
    out: list[tuple[str, ...]] = []
    seen: set[tuple[str, ...]] = set()
    for k in range(1, len(names) + 1):
        for subset in itertools.combinations(names, k):
            orders = itertools.permutations(subset) if k <= 5 else (_nearest_chain(topo, subset, s) for s in subset)
            for o in orders:
                o = tuple(o)
                if o in seen:
                    continue
                if len(o) > 1 and o[::-1] in seen and all(sig[a] == sig[b] for a, b in zip(o, o[::-1], strict=True)):
                    continue  # a mirror of a symmetric chain scores the same
                if all(topo.link(a, b) for a, b in zip(o, o[1:], strict=False)):
                    out.append(o)
                    seen.add(o)
    return out


def _nearest_chain(topo: Topology, subset: tuple[str, ...], start: str) -> tuple[str, ...]:
    left, chain = set(subset) - {start}, [start]
    while left:
        def lat(n: str) -> tuple[float, str]:
            link = topo.link(chain[-1], n)
            return (link.latency_ms if link else 1e9, n)

        nxt = min(left, key=lat)
        chain.append(nxt)
        left.remove(nxt)
    return tuple(chain)


def stage_counts(order: tuple[str, ...], topo: Topology, pp: int, per_stage: int) -> tuple[int, ...] | None:
    """Stages per DC of `order`: one each, the rest to the fastest GPUs, then the largest memory (DCs
    alike share in proportion to their room); None if the DCs cannot hold pp stages of `per_stage`
    GPUs with one each."""
    dcs = [topo.dc(n) for n in order]
    caps = [d.gpus // per_stage for d in dcs]
    if pp < len(order) or min(caps) < 1 or sum(caps) < pp:
        return None
    counts = [1] * len(order)
    left = pp - len(order)
    rank = {i: (-GPUS[d.gpu].peak_tflops, -GPUS[d.gpu].memory_gb) for i, d in enumerate(dcs)}
    for cls in sorted(set(rank.values())):
        members = [i for i in range(len(order)) if rank[i] == cls]
        room = [caps[i] - 1 for i in members]
        take = min(left, sum(room))
        if take == sum(room):
            add = room
        else:  # largest remainder, ties to the earlier DC
            quota = [take * r / sum(room) for r in room]
            add = [int(q) for q in quota]
            for j in sorted(range(len(members)), key=lambda j: (-(quota[j] - add[j]), j))[:take - sum(add)]:
                add[j] += 1
        for i, a in zip(members, add, strict=True):
            counts[i] += a
        left -= take
    return tuple(counts)


def layouts(exp: Experiment, tps: list[int] | None = None, pps: list[int] | None = None,
            microbatch_sizes: list[int] | None = None) -> list[tuple[Layout | None, tuple, str]]:
    """Every (chain, tp, microbatch, pp) with its largest fitting dp: (layout, key, "") or (None, key, why)."""
    topo, w = exp.topology, exp.workload
    model = resolve_model(w.model, w.seq_len)
    mbs = microbatch_sizes or [b for b in MICROBATCHES if w.global_batch % b == 0]
    out: list[tuple[Layout | None, tuple, str]] = []
    orders = chains(topo)
    most = len(orders) * len(mbs) * (len(tps) if tps else 8) * (len(pps) if pps else model.layers)
    if most > MAX_LAYOUTS:
        raise SpecError("topology.dcs", f"{len(orders):,} DC chains x tp x pp x microbatch sizes give up to {most:,} "
                        f"layouts to estimate (at most {MAX_LAYOUTS:,})",
                        "pin --tp, --pp or --microbatch, or list fewer candidate DCs")
    for order in orders:
        dcs = [topo.dc(n) for n in order]
        gpn = math.gcd(*[d.gpus_per_node for d in dcs])
        tp_opts = tps or [t for t in range(1, gpn + 1) if gpn % t == 0]
        for tp in tp_opts:
            if model.heads % tp or model.kv_heads % tp or gpn % tp:
                continue
            total = sum(d.gpus for d in dcs) // tp
            pp_opts = pps or list(range(len(order), min(model.layers, total) + 1))
            for mb in mbs:
                if w.global_batch % mb:
                    continue
                # stages each DC holds at every dp dividing the batch, largest dp first
                caps = [(dp, [d.gpus // (tp * dp) for d in dcs])
                        for dp in divisors_desc(w.global_batch // mb, sum(d.gpus for d in dcs) // tp)]
                caps = [(dp, c, sum(c)) for dp, c in caps if min(c) >= 1]
                i = 0
                for pp in sorted(pp_opts):
                    if pp < len(order) or pp > model.layers:
                        continue
                    key = (order, tp, pp, mb)
                    while i < len(caps) and caps[i][2] < pp:
                        i += 1  # more stages need a smaller dp
                    if i == len(caps):
                        out.append((None, key, f"no dp dividing {w.global_batch // mb} sequences gives each DC a "
                                               f"stage of tp*dp GPUs"))
                        continue
                    dp = caps[i][0]
                    out.append((Layout(order, stage_counts(order, topo, pp, tp * dp), tp, pp, dp, mb), key, ""))
    return out


def _equivalence(topo: Topology, lay: Layout) -> tuple:
    """What the simulator sees of a layout: its DCs and WAN hops by description, not by name."""
    hops = []
    for a, b in zip(lay.order, lay.order[1:], strict=False):
        link = topo.link(a, b)
        hops.append((link.gbps, link.latency_ms, topo.window_mb(link)) if link else None)
    return (tuple(dc_signature(topo.dc(d)) for d in lay.order), lay.counts, tuple(hops), lay.tp, lay.pp, lay.dp,
            lay.microbatch)


def _simulate(args: tuple) -> tuple[float, list[int]]:
    """Iteration time (or, with `lower_bound`, the lower bound) of one layout, and its layer split."""
    exp, scheduler, lay, lower_bound = args
    from testbed.runs.simulated import lower_bound_s
    from testbed.sim.executor import simulate

    w = exp.workload.model_copy(update={"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "microbatch": lay.microbatch})
    plan = build_plan(exp.model_copy(update={"workload": w}), scheduler, run_id="-".join(lay.order), dp=lay.dp,
                      order=list(lay.order), counts=list(lay.counts))
    return (lower_bound_s(plan) if lower_bound else simulate(plan)[0].iteration_s[0]), plan.layers


def _estimate(args: tuple) -> list[tuple[float, list[int], float, str]]:
    exp, scheduler, lays = args
    mech = parse_scheduler(scheduler)
    est = Estimator(exp, resolve_model(exp.workload.model, exp.workload.seq_len), mech)
    return [(e.iteration_s, e.layers, e.mem_gb, e.problem) for e in map(est, lays)]


def _estimate_all(exp: Experiment, scheduler: str, lays: list[Layout], pool: ProcessPoolExecutor | None, jobs: int
                  ) -> list[tuple[float, list[int], float, str]]:
    """Estimates in layout order; with a pool, chains are spread over `jobs` processes (a chain's layouts
    stay together: they share cached stage costs)."""
    if pool is None or len(lays) < 2000:
        return _estimate((exp, scheduler, lays))
    by_chain: dict[tuple[str, ...], list[int]] = {}
    for i, lay in enumerate(lays):
        by_chain.setdefault(lay.order, []).append(i)
    bins: list[list[int]] = [[] for _ in range(jobs)]
    for idx in sorted(by_chain.values(), key=len, reverse=True):
        min(bins, key=len).extend(idx)
    bins = [b for b in bins if b]
    out: list = [None] * len(lays)
    for b, res in zip(bins, pool.map(_estimate, [(exp, scheduler, [lays[i] for i in b]) for b in bins]),
                      strict=True):
        for i, r in zip(b, res, strict=True):
            out[i] = r
    return out


def search(exp: Experiment, scheduler: str = "atlas", top: int = 2, tps: list[int] | None = None,
           pps: list[int] | None = None, microbatch_sizes: list[int] | None = None, jobs: int | None = None
           ) -> Search:
    """Estimate every layout, simulate the best `top` of every DC set, return them all (best first)."""
    t0 = time.perf_counter()
    mech = parse_scheduler(scheduler)
    if mech.placement != "atlas":
        raise SpecError("--scheduler", f"{scheduler!r} places stages by its own rule, not the planner's",
                        "use atlas (or pp-wan+greedy for today's single-connection, fair-shared WAN)")
    if top < 1:
        raise SpecError("--top", "simulates no candidate", "use --top 1 or more")
    jobs = max(1, jobs or os.cpu_count() or 1)
    pool = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None
    try:
        return _search(exp, scheduler, top, tps, pps, microbatch_sizes, pool, jobs, t0)
    finally:
        if pool is not None:
            pool.shutdown()


def _search(exp: Experiment, scheduler: str, top: int, tps: list[int] | None, pps: list[int] | None,
            microbatch_sizes: list[int] | None, pool: ProcessPoolExecutor | None, jobs: int, t0: float) -> Search:
    topo, w = exp.topology, exp.workload
    tokens = w.global_batch * resolve_model(w.model, w.seq_len).seq_len
    order_of = {d.name: i for i, d in enumerate(topo.dcs)}
    found = layouts(exp, tps, pps, microbatch_sizes)
    placed = [lay for lay, _, _ in found if lay is not None]
    estimates = iter(_estimate_all(exp, scheduler, placed, pool, jobs))
    cands: list[Candidate] = []
    set_free: dict[str, int] = {}
    set_problem: dict[str, str] = {}
    for lay, (order, tp, pp, mb), why in found:
        names = sorted(order, key=order_of.__getitem__)
        dcs = "|".join(names)
        set_free[dcs] = sum(topo.dc(n).gpus for n in names)
        if lay is None:
            cands.append(Candidate(Layout(order, (), tp, pp, 0, mb), dcs, 0, set_free[dcs], 0, [], 0.0,
                                   math.inf, status=f"rejected: {why}", tokens=tokens))
            set_problem.setdefault(dcs, why)
            continue
        it, layers, mem, problem = next(estimates)
        c = Candidate(lay, dcs, lay.tp * lay.pp * lay.dp, set_free[dcs] - lay.tp * lay.pp * lay.dp,
                      w.global_batch // (lay.microbatch * lay.dp), layers, mem, it, tokens=tokens)
        if problem:
            c.status = f"rejected: {problem}"
            if dcs not in set_problem or "needs" not in set_problem[dcs]:
                set_problem[dcs] = problem
        cands.append(c)
    t_est = time.perf_counter()

    chosen: list[Candidate] = []
    for dcs in set_free:
        ok = sorted((c for c in cands if c.dcs == dcs and not c.status.startswith("rejected")),
                    key=lambda c: (c.estimate_s, -c.gpus, c.key()))
        chosen += ok[:top]
    # layouts on identical DCs and links (e.g. each of three identical sites alone) simulate once
    same = {c.key(): _equivalence(topo, c.layout) for c in chosen}
    unique = list({same[c.key()]: c for c in reversed(chosen)}.values())[::-1]
    unique.sort(key=lambda c: -c.gpus * c.microbatches)  # the longest first, so the processes end together
    tasks = [(exp, scheduler, c.layout, False) for c in unique]
    results = list(pool.map(_simulate, tasks)) if pool is not None and len(tasks) > 1 else list(map(_simulate, tasks))
    done = dict(zip((same[c.key()] for c in unique), results, strict=True))
    for c in chosen:
        it, layers = done[same[c.key()]]
        if layers != c.layers:
            raise RuntimeError(f"planner and plan disagree on the layer split: {c.layers} vs {layers}")
        c.iteration_s = it
        c.status = "simulated"

    sets: list[SetResult] = []
    for dcs in sorted(set_free, key=lambda s: (s.count("|"), [order_of[n] for n in s.split("|")])):
        sim = [c for c in chosen if c.dcs == dcs]
        if sim:
            b = sorted(sim, key=lambda c: (-(c.tokens_per_s or 0.0), c.gpus, c.key()))[0]
            b.status = "best of its DC set"
            sets.append(SetResult(dcs, set_free[dcs], b))
        else:
            sets.append(SetResult(dcs, set_free[dcs], None, set_problem.get(dcs, "no layout fits")))
    bests = [s.best for s in sets if s.best is not None]
    best = sorted(bests, key=lambda c: (-(c.tokens_per_s or 0.0), c.gpus, c.key()))[0] if bests else None
    if best is not None:
        best.status = "best"
        best.lower_bound_s = _simulate((exp, scheduler, best.layout, True))[0]

    def rank(c: Candidate) -> tuple:
        if c.iteration_s is not None:
            return (0, -(c.tokens_per_s or 0.0), c.dcs, c.key())
        if not c.status.startswith("rejected"):
            return (1, c.estimate_s, c.dcs, c.key())
        return (2, 0.0, c.dcs, c.key())

    cands.sort(key=rank)
    return Search(cands, sets, best, scheduler, simulated=len(unique) + (best is not None),
                  wall_s=time.perf_counter() - t0, estimate_wall_s=t_est - t0)


PLAN_HEADER = ("dcs", "order", "stages", "layers", "tp", "pp", "dp", "microbatch", "microbatches", "gpus",
               "idle_gpus", "mem_gb", "estimate_s", "iteration_s", "lower_bound_s", "tokens_per_s",
               "tokens_per_s_per_gpu", "status")


def plan_rows(res: Search):
    """One CSV row per layout (columns: docs/planner.md); empty where a value does not apply."""

    def num(x: float | None, digits: int) -> str:
        return "" if x is None or not math.isfinite(x) else fmt(x, digits)

    for c in res.candidates:
        lay, placed = c.layout, bool(c.layout.counts)
        yield (c.dcs, " > ".join(lay.order),
               " ".join(f"{d}:{n}" for d, n in zip(lay.order, lay.counts, strict=True)),
               " ".join(map(str, c.layers)), lay.tp, lay.pp, lay.dp if placed else "", lay.microbatch,
               c.microbatches if placed else "", c.gpus if placed else "", c.idle_gpus,
               num(c.mem_gb, 2) if placed else "", num(c.estimate_s, 6), num(c.iteration_s, 6),
               num(c.lower_bound_s, 6), num(c.tokens_per_s, 1), num(c.tokens_per_s_per_gpu, 3), c.status)

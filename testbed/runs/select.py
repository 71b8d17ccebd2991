"""The planner: which DCs, in which pipeline order, with which tp, pp, dp and microbatch size.

Every chain of DCs (every subset, every order up to 5 DCs; mirrored chains of identical DCs once) x
tp x microbatch size x pp is a layout: it gets the largest dp whose stages (tp*dp GPUs each,
consecutive per DC) fit, the extra stages going to the fastest and largest DCs, and its layers
balanced by GPU speed and memory. The analytic estimate (estimate.py) ranks the layouts that fit in
memory; the simulator, the objective, scores the best `top` of every DC set. So each set's answer
(one site or several) is a simulated one, and adding a DC to the topology only adds candidates: the
chosen plan never gets slower.

With `families` it compares the ways to train across DCs (runs/families.py): each family's layouts are
estimated and simulated with its own scheduler, one best row per (family, DC set), ranked by effective tokens/s
(tokens/s x the family's token efficiency, plan/efficiency.py).
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
from testbed.plan import groups as hybrid_groups
from testbed.plan.build import divisors_desc
from testbed.plan.diloco import resolve as resolve_diloco
from testbed.plan.efficiency import token_efficiency
from testbed.plan.estimate import Estimator, Layout
from testbed.plan.estimate_dp import FamilyEstimator
from testbed.results import fmt
from testbed.runs.families import FAMILIES, dp_layouts, hybrid_layouts
from testbed.runs.period import timed
from testbed.spec.experiment import Experiment
from testbed.spec.mechanisms import parse_scheduler
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
    family: str = "pipeline"
    scheduler: str = "atlas"
    token_efficiency: float = 1.0

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.iteration_s if self.iteration_s else None

    @property
    def effective_tokens_per_s(self) -> float | None:
        t = self.tokens_per_s
        return t * self.token_efficiency if t is not None else None

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        t = self.tokens_per_s
        return t / self.gpus if t is not None else None

    def key(self) -> tuple:
        lay = self.layout
        return (lay.order, lay.tp, lay.pp, lay.microbatch) + ((lay.groups,) if lay.groups else ())


@dataclass
class SetResult:
    dcs: str
    free_gpus: int
    best: Candidate | None
    problem: str = ""  # why nothing in this set fits, when best is None
    family: str = "pipeline"


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


def _equivalence(topo: Topology, lay: Layout, ring: bool = False) -> tuple:
    """What the simulator sees of a layout: its DCs and WAN hops (a ring's closing hop too) by description, not by
    name."""
    hops = []
    for a, b in zip(lay.order, lay.order[1:] + (lay.order[:1] if ring and len(lay.order) > 2 else ()),
                    strict=False):
        link = topo.link(a, b)
        hops.append((link.gbps, link.latency_ms, topo.window_mb(link)) if link else None)
    return (tuple(dc_signature(topo.dc(d)) for d in lay.order), lay.counts, tuple(hops), lay.tp, lay.pp, lay.dp,
            lay.microbatch, lay.groups)


def _simulate(args: tuple) -> tuple[float, list[int], float, str]:
    """Iteration time (or, with `lower_bound`, the lower bound) of one layout, its layer split, its token
    efficiency, and why the plan cannot be built ("" when it can)."""
    exp, scheduler, lay, lower_bound = args
    w = exp.workload.model_copy(update={"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "microbatch": lay.microbatch,
                                        "groups": group_spec(lay)})
    order, counts = (None, None) if lay.groups else (list(lay.order), list(lay.counts))
    try:
        it, layers, eff = timed(exp.model_copy(update={"workload": w}), scheduler, lay.dp, order, counts,
                                lower_bound)
    except SpecError as e:
        return math.inf, [], 0.0, str(e)
    return it, layers, eff, ""


def _estimate(args: tuple) -> list[tuple[float, list[int], float, str]]:
    exp, scheduler, lays = args
    mech = parse_scheduler(scheduler)
    kind = FamilyEstimator if mech.placement == "dp-wan" else Estimator
    est = kind(exp, resolve_model(exp.workload.model, exp.workload.seq_len), mech)
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
           pps: list[int] | None = None, microbatch_sizes: list[int] | None = None, jobs: int | None = None,
           families: list[str] | None = None, keep: list[tuple[str, tuple]] | None = None) -> Search:
    """Estimate every layout, simulate the best `top` of every (family, DC set), return them all (best first).
    `families` (runs/families.py; default: the pipeline family only, scored by `scheduler`); `keep`: (family,
    layout key) pairs simulated as well when they fit (a sweep keeps the plans of its other points in play)."""
    t0 = time.perf_counter()
    mech = parse_scheduler(scheduler)
    if mech.placement != "atlas":
        raise SpecError("--scheduler", f"{scheduler!r} places stages by its own rule, not the planner's pipeline "
                        "search", "use atlas (or pp-wan+greedy for Megatron-LM's fair-shared NCCL sockets); "
                        "the data-parallel families are searched with --families")
    if top < 1:
        raise SpecError("--top", "simulates no candidate", "use --top 1 or more")
    if exp.workload.groups:
        raise SpecError("workload.groups", "the planner chooses the groups itself (the hybrid family)",
                        "leave workload.groups out, or simulate your groups with testbed sim")
    fams = [(f, scheduler if f == "pipeline" else FAMILIES[f]) for f in (families or ["pipeline"])]
    jobs = max(1, jobs or os.cpu_count() or 1)
    pool = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None
    try:
        return _search(exp, fams, top, tps, pps, microbatch_sizes, pool, jobs, t0, set(keep or []))
    finally:
        if pool is not None:
            pool.shutdown()


@dataclass
class _Family:
    """One family's candidates during a search."""

    name: str
    scheduler: str
    cands: list[Candidate]
    set_free: dict[str, int]
    set_problem: dict[str, str]
    chosen: list[Candidate]


def _efficiency_problem(exp: Experiment, scheduler: str, dcs: int) -> str:
    """Why a family has no token efficiency on `dcs` DCs (outside the published range, none given); "" if it has."""
    mech = parse_scheduler(scheduler)
    try:
        d = resolve_diloco(mech.outer, exp.workload.diloco) if mech.outer else None
        token_efficiency(mech.outer, dcs, d, exp.workload.token_efficiency)
    except SpecError as e:
        return str(e)
    return ""


def _candidates(exp: Experiment, family: str, scheduler: str, top: int, tps: list[int] | None,
                pps: list[int] | None, microbatch_sizes: list[int] | None, pool: ProcessPoolExecutor | None,
                jobs: int, keep: set[tuple[str, tuple]]) -> _Family:
    """A family's layouts, estimated, with the ones to simulate chosen: the best `top` of each DC set."""
    topo, w = exp.topology, exp.workload
    tokens = w.global_batch * resolve_model(w.model, w.seq_len).seq_len
    order_of = {d.name: i for i, d in enumerate(topo.dcs)}
    found = (layouts(exp, tps, pps, microbatch_sizes) if family == "pipeline"
             else hybrid_layouts(exp, tps, pps, microbatch_sizes, MICROBATCHES, MAX_LAYOUTS) if family == "hybrid"
             else dp_layouts(exp, tps, pps, microbatch_sizes, MICROBATCHES, MAX_LAYOUTS))
    placed = [lay for lay, _, _ in found if lay is not None]
    estimates = iter(_estimate_all(exp, scheduler, placed, pool, jobs))
    fam = _Family(family, scheduler, [], {}, {}, [])
    no_efficiency: dict[int, str] = {}
    for lay, key, why in found:
        order, tp, pp, mb = key[:4]
        names = sorted(order, key=order_of.__getitem__)
        dcs = "|".join(names)
        fam.set_free[dcs] = sum(topo.dc(n).gpus for n in names)
        if lay is None:
            fam.cands.append(Candidate(Layout(order, (), tp, pp, 0, mb, *key[4:]), dcs, 0, fam.set_free[dcs], 0,
                                       [], 0.0, math.inf, status=f"rejected: {why}", tokens=tokens, family=family,
                                       scheduler=scheduler))
            fam.set_problem.setdefault(dcs, why)
            continue
        it, layers, mem, problem = next(estimates)
        if family != "pipeline":
            problem = problem or no_efficiency.setdefault(len(order), _efficiency_problem(exp, scheduler, len(order)))
        c = Candidate(lay, dcs, lay.tp * lay.pp * lay.dp, fam.set_free[dcs] - lay.tp * lay.pp * lay.dp,
                      w.global_batch // (lay.microbatch * lay.dp), layers, mem, it, tokens=tokens, family=family,
                      scheduler=scheduler)
        if problem:
            c.status = f"rejected: {problem}"
            if dcs not in fam.set_problem or "needs" not in fam.set_problem[dcs]:
                fam.set_problem[dcs] = problem
        fam.cands.append(c)
    for dcs in fam.set_free:
        ok = sorted((c for c in fam.cands if c.dcs == dcs and not c.status.startswith("rejected")),
                    key=lambda c: (c.estimate_s, -c.gpus, c.key()))
        fam.chosen += ok[:top] + [c for c in ok[top:] if (family, c.key()) in keep]
    return fam


def _search(exp: Experiment, fams: list[tuple[str, str]], top: int, tps: list[int] | None, pps: list[int] | None,
            microbatch_sizes: list[int] | None, pool: ProcessPoolExecutor | None, jobs: int, t0: float,
            keep: set[tuple[str, tuple]]) -> Search:
    topo = exp.topology
    order_of = {d.name: i for i, d in enumerate(topo.dcs)}
    found = [_candidates(exp, f, s, top, tps, pps, microbatch_sizes, pool, jobs, keep) for f, s in fams]
    t_est = time.perf_counter()

    # layouts on identical DCs and links (e.g. each of three identical sites alone) simulate once
    same = {(f.scheduler, c.key()): (f.scheduler, _equivalence(topo, c.layout, f.name != "pipeline"))
            for f in found for c in f.chosen}
    unique = list({same[(c.scheduler, c.key())]: c for f in found for c in reversed(f.chosen)}.values())[::-1]
    unique.sort(key=lambda c: -c.gpus * c.microbatches)  # the longest first, so the processes end together
    tasks = [(exp, c.scheduler, c.layout, False) for c in unique]
    results = list(pool.map(_simulate, tasks)) if pool is not None and len(tasks) > 1 else list(map(_simulate, tasks))
    done = dict(zip((same[(c.scheduler, c.key())] for c in unique), results, strict=True))
    sets: list[SetResult] = []
    for f in found:
        for c in f.chosen:
            it, layers, eff, problem = done[same[(c.scheduler, c.key())]]
            if problem:
                c.status = f"rejected: {problem}"
                continue
            if layers != c.layers and not c.layout.groups:  # a hybrid's split is the plan's (groups may differ)
                raise RuntimeError(f"planner and plan disagree on the layer split: {c.layers} vs {layers}")
            c.iteration_s, c.token_efficiency, c.status, c.layers = it, eff, "simulated", layers
        for dcs in f.set_free:
            sim = [c for c in f.chosen if c.dcs == dcs and c.iteration_s is not None]
            if sim:
                b = sorted(sim, key=_by_effective)[0]
                b.status = "best of its family and DC set"
                sets.append(SetResult(dcs, f.set_free[dcs], b, family=f.name))
            else:
                sets.append(SetResult(dcs, f.set_free[dcs], None, f.set_problem.get(dcs, "no layout fits"),
                                      family=f.name))
    sets.sort(key=lambda s: (s.dcs.count("|"), [order_of[n] for n in s.dcs.split("|")],
                             list(FAMILIES).index(s.family)))
    bests = [s.best for s in sets if s.best is not None]
    best = sorted(bests, key=_by_effective)[0] if bests else None
    if best is not None:
        best.status = "best"
        best.lower_bound_s = _simulate((exp, best.scheduler, best.layout, True))[0]

    def rank(c: Candidate) -> tuple:
        if c.iteration_s is not None:
            return (0, -(c.effective_tokens_per_s or 0.0), c.dcs, c.family, c.key())
        if not c.status.startswith("rejected"):
            return (1, c.estimate_s, c.dcs, c.family, c.key())
        return (2, 0.0, c.dcs, c.family, c.key())

    cands = sorted((c for f in found for c in f.cands), key=rank)
    return Search(cands, sets, best, fams[0][1] if len(fams) == 1 else "by family",
                  simulated=len(unique) + (best is not None), wall_s=time.perf_counter() - t0,
                  estimate_wall_s=t_est - t0)


def _by_effective(c: Candidate) -> tuple:
    """Best first: effective tokens/s, then fewer GPUs, then the layout."""
    return (-(c.effective_tokens_per_s or 0.0), c.gpus, c.family, c.key())


PLAN_HEADER = ("family", "scheduler", "dcs", "order", "stages", "replicas", "layers", "tp", "pp", "dp", "microbatch",
               "microbatches", "gpus", "idle_gpus", "mem_gb", "estimate_s", "iteration_s", "lower_bound_s",
               "tokens_per_s", "tokens_per_s_per_gpu", "token_efficiency", "effective_tokens_per_s", "status")


def group_spec(lay: Layout) -> dict[str, list[str]] | None:
    """A hybrid layout's `workload.groups` (g0, g1, ... in its order); None for the other families."""
    return {f"g{i}": list(g) for i, g in enumerate(lay.group_dcs())} if lay.groups else None


def order_text(lay: Layout) -> str:
    """The DCs in pipeline order, a hybrid's groups apart: "a > b | c"."""
    return " | ".join(" > ".join(g) for g in lay.group_dcs()) if lay.groups else " > ".join(lay.order)


def per_dc(c: Candidate) -> tuple[str, str]:
    """The layout's stages per DC and, for a data-parallel family, its whole replicas per DC ("dc:n ..."; a
    hybrid's per group, "a>b:n")."""
    lay = c.layout
    if lay.groups and lay.counts:
        stages = " ".join(f"{d}:{n}" for g in lay.group_dcs()
                          for d, n in zip(g, hybrid_groups.stage_counts(len(g), lay.pp), strict=True))
        return stages, " ".join(f"{'>'.join(g)}:{n}" for g, n in zip(lay.group_dcs(), lay.counts, strict=True))
    if c.family == "pipeline":
        return " ".join(f"{d}:{n}" for d, n in zip(lay.order, lay.counts, strict=True)), ""
    if not lay.counts:
        return "", ""
    return (" ".join(f"{d}:{lay.pp}" for d in lay.order),
            " ".join(f"{d}:{n}" for d, n in zip(lay.order, lay.counts, strict=True)))


def plan_rows(res: Search):
    """One CSV row per layout (columns: docs/planner.md); empty where a value does not apply."""

    def num(x: float | None, digits: int) -> str:
        return "" if x is None or not math.isfinite(x) else fmt(x, digits)

    for c in res.candidates:
        lay, placed = c.layout, bool(c.layout.counts)
        stages, replicas = per_dc(c)
        yield (c.family, c.scheduler, c.dcs, order_text(lay), stages, replicas,
               " ".join(map(str, c.layers)), lay.tp, lay.pp, lay.dp if placed else "", lay.microbatch,
               c.microbatches if placed else "", c.gpus if placed else "", c.idle_gpus,
               num(c.mem_gb, 2) if placed else "", num(c.estimate_s, 6), num(c.iteration_s, 6),
               num(c.lower_bound_s, 6), num(c.tokens_per_s, 1), num(c.tokens_per_s_per_gpu, 3),
               num(c.token_efficiency, 6) if c.iteration_s is not None else "", num(c.effective_tokens_per_s, 1),
               c.status)

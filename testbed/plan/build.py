"""Spec -> Plan: resolve the model, check the job fits, place it, derive the WAN plan."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from testbed.costs.gpus import GPUS
from testbed.costs.models import ModelConfig, resolve_model
from testbed.costs.operators import model_flops_per_token
from testbed.costs.stage import BF16, in_flight, layer_costs
from testbed.errors import NotYetError, SpecError
from testbed.net.links import NetPlan
from testbed.net.units import gbps_to_bytes_s
from testbed.plan.batch_split import split_by_speed
from testbed.plan.buckets import bucket_bytes
from testbed.plan.choose import Pick, candidates, fingerprint, resolved, turn_orders
from testbed.plan.diloco import resolve as resolve_diloco
from testbed.plan.efficiency import token_efficiency
from testbed.plan.layers import chunk_layers, empty_chunk, stage_layers
from testbed.plan.network import link_plans, lower_network
from testbed.plan.placement import place
from testbed.plan.plan import MAX_STAGE_MICROBATCHES, IntraDC, Plan
from testbed.plan.schedules import build_schedule, check_interleaving
from testbed.spec.experiment import Experiment
from testbed.spec.mechanisms import Mechanisms, parse_scheduler
from testbed.spec.topology import Topology


def check_workload(exp: Experiment, model: ModelConfig) -> None:
    w = exp.workload
    if w.pp > model.layers:
        raise SpecError("workload.pp", f"{w.pp} stages for a {model.layers}-layer model", f"use pp <= {model.layers}")
    if model.heads % w.tp:
        raise SpecError("workload.tp", f"tp={w.tp} does not divide the model's {model.heads} heads",
                        "use a tp that divides the number of heads")
    if model.kv_heads % w.tp:
        raise SpecError("workload.tp", f"tp={w.tp} does not divide the model's {model.kv_heads} key/value heads",
                        "use a tp that divides the number of key/value heads (Megatron shards them too)")
    if w.global_batch % w.microbatch:
        raise SpecError("workload.global_batch", f"{w.global_batch} is not a multiple of microbatch={w.microbatch}",
                        "make global_batch a multiple of microbatch")


def divisors_desc(n: int, limit: int) -> list[int]:
    """Divisors of n no larger than limit, largest first, in O(sqrt n) steps."""
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return [d for d in large + small[::-1] if d <= limit]


def check_nodes(topo: Topology, tp: int, dcs: set[str]) -> None:
    """Each TP group stays inside one node (NVLink) of every DC that runs a stage."""
    for d in topo.dcs:
        if d.name in dcs and d.gpus_per_node % tp:
            raise SpecError("workload.tp", f"tp={tp} does not divide DC {d.name}'s {d.gpus_per_node} GPUs per node",
                            "keep each TP group inside one node: use a divisor of gpus_per_node")


def _dp_candidates(exp: Experiment) -> list[int]:
    """DP degrees that divide the batch, largest first; never more replicas than the GPUs can hold. With the batch
    split by speed and only data-parallel families, every degree up to one microbatch per replica."""
    w = exp.workload
    gpus = sum(d.gpus for d in exp.topology.dcs)
    seqs, most = w.global_batch // w.microbatch, gpus // (w.tp * w.pp)
    if all(speed_split(w, parse_scheduler(s)) for s in exp.schedulers):
        return list(range(min(seqs, most), 0, -1))
    return divisors_desc(seqs, most)


def speed_split(w, mech: Mechanisms) -> bool:
    """Whether this plan shares the batch by its replicas' speed (`workload.batch_split: speed`): data-parallel
    families only, since a pipeline family runs every replica on the same DC chain at one speed."""
    return w.batch_split == "speed" and mech.placement == "dp-wan"


def resolve_dp(exp: Experiment) -> int:
    """`dp: auto` = the largest DP degree that divides the batch and that every scheduler can place."""
    w = exp.workload
    if w.dp != "auto":
        seqs = w.global_batch // w.microbatch
        if seqs % w.dp and w.batch_split == "even":
            raise SpecError("workload.dp", f"dp={w.dp} does not divide {seqs} microbatch-sized sequences per batch "
                            "(every replica takes an equal share; a split by each site's speed is not supported yet)",
                            "pick a dp dividing global_batch/microbatch, or dp: auto")
        return int(w.dp)
    pins = [(m, pinned_chain(exp, m)) for m in (parse_scheduler(s) for s in exp.schedulers)]
    # a scheduler whose family is DP across DCs must not lose its WAN to `auto`: a degree that keeps every dp-wan
    # replica in one DC is skipped, and if no degree spreads them the run is refused with the fix
    across = len(exp.topology.dcs) > 1 and not w.groups
    one_dc: tuple[int, str] | None = None
    for dp in _dp_candidates(exp):
        try:
            placed = [(m, counts, place(m.placement, exp.topology, w.pp, w.tp, dp, order, counts, w.groups))
                      for m, (order, counts) in pins]
        except SpecError:
            continue
        lone = [rows[0][0] for m, counts, rows in placed
                if across and m.placement == "dp-wan" and counts is None and len({r[0] for r in rows}) == 1]
        if not lone:
            return dp
        one_dc = one_dc or (dp, lone[0])
    if one_dc is not None:
        dp, dc = one_dc
        raise SpecError("workload.dp", f"dp: auto fits every dp-wan replica in {dc} (dp {dp}: no WAN, not DP across "
                        "DCs) and no degree dividing the batch spreads them",
                        "pin them with workload.replicas_per_dc (replicas per DC, e.g. half in each of two DCs)")
    gpus = sum(d.gpus for d in exp.topology.dcs)
    if gpus < w.tp * w.pp:
        raise SpecError("workload", f"one replica needs tp*pp = {w.tp * w.pp:,} GPUs; the topology has {gpus:,}",
                        "lower workload.tp or workload.pp, or add GPUs")
    raise SpecError("workload.dp", "no DP degree fits every scheduler's placement", "lower workload.tp or workload.pp")


def pinned_chain(exp: Experiment, mech: Mechanisms) -> tuple[list[str] | None, list[int] | None]:
    """`workload.stages_per_dc` as (DC order, stages per DC) for pipeline placements, `workload.replicas_per_dc`
    as (DCs, replicas per DC) for dp-wan's; (None, None) if unset."""
    w = exp.workload
    if mech.placement == "dp-wan":
        return pinned_replicas(exp)
    if not w.stages_per_dc:
        return None, None
    known_dcs(exp, "workload.stages_per_dc", w.stages_per_dc)
    if sum(w.stages_per_dc.values()) != w.pp:
        raise SpecError("workload.stages_per_dc", f"{sum(w.stages_per_dc.values())} stages but pp={w.pp}",
                        "make the stage counts add up to workload.pp")
    return list(w.stages_per_dc), list(w.stages_per_dc.values())


def known_dcs(exp: Experiment, field: str, dcs: Iterable[str]) -> None:
    """Raise, naming `field`, at the first of `dcs` that is not a DC of the topology."""
    names = [d.name for d in exp.topology.dcs]
    for d in dcs:
        if d not in names:
            raise SpecError(field, f"unknown DC {d!r}", f"use DCs of the topology: {', '.join(names)}")


def pinned_replicas(exp: Experiment) -> tuple[list[str] | None, list[int] | None]:
    """`workload.replicas_per_dc` as (DCs, whole replicas per DC); (None, None) if unset."""
    w = exp.workload
    if not w.replicas_per_dc:
        return None, None
    known_dcs(exp, "workload.replicas_per_dc", w.replicas_per_dc)
    total = sum(w.replicas_per_dc.values())
    if w.dp != "auto" and total != w.dp:
        raise SpecError("workload.replicas_per_dc", f"{total} replicas but dp={w.dp}",
                        "make the replica counts add up to workload.dp (or set dp: auto)")
    return list(w.replicas_per_dc), list(w.replicas_per_dc.values())


def stagger_offsets(row: list[str], act_bytes: list[float], links: dict, dp: int) -> list[float]:
    """Start offsets that make replicas take turns on the slowest WAN hop: one turn is one transfer time at
    the rate a transfer really gets, A / min(C, n W / RTT), and a link whose transfers are window-bound
    carries g = C / min(C, n W / RTT) of them side by side, so replicas enter in groups of g, one turn apart."""
    turn, group = 0.0, dp
    for s in range(len(row) - 1):
        if row[s] != row[s + 1]:
            lp = links[(row[s], row[s + 1])]
            t = act_bytes[s] / lp.transfer_rate_bytes_s
            if t > turn:
                turn, group = t, max(1, math.floor(lp.capacity_bytes_s / lp.transfer_rate_bytes_s * (1 + 1e-12)))
    return [(r // group) * turn for r in range(dp)]


def wan_round_trips(row: list[str], act_bytes: list[float], links: dict, dp: int = 1) -> tuple[list[float], float]:
    """Per stage boundary k -> k+1: the activation there and its gradient back over the WAN (one way each:
    latency + transfer at the rate a transfer gets when the dp replicas crossing the hop share it,
    min(C / dp, n W / RTT), whether they share it side by side or take turns); 0 inside a DC. And the
    longest any hop is busy per microbatch (that transfer time, max over hops and directions; 0 without
    WAN hops): the pipeline cannot take microbatches faster than one per this."""
    out, busy = [], 0.0
    for k in range(len(row) - 1):
        rt = 0.0
        if row[k] != row[k + 1]:
            for lp in (links[(row[k], row[k + 1])], links[(row[k + 1], row[k])]):
                transfer = act_bytes[k] / min(lp.capacity_bytes_s / dp, lp.transfer_cap_bytes_s)
                rt += lp.latency_s + transfer
                busy = max(busy, transfer)
        out.append(rt)
    return out, busy


def latency_warmup(fb_s: list[float], round_trips: list[float], free_gb: list[float], act_gb: list[float], m: int,
                   schedule: str, busy_s: float = 0.0) -> list[int]:
    """Extra 1F1B warm-up per stage: enough microbatches to cover the WAN round trips downstream of
    the stage (`round_trips`, one per stage boundary), as many as the GPU's free memory allows, and
    never increasing along the pipeline. `fb_s` is a stage's forward plus backward per microbatch.
    Little's law: a round trip holds as many microbatches as enter during it, one per max(fb_s, busy_s)
    where `busy_s` is the busiest WAN hop's time per microbatch (wan_round_trips). On a link that is the
    bottleneck more in flight adds nothing but delay: counting the round trip in compute times there
    asked for every microbatch, which turned 1F1B into GPipe and kept one direction of each link idle
    while the other worked (1.7x slower at 1 Gbit/s)."""
    pp = len(fb_s)
    if schedule != "1f1b":
        return [0] * pp
    downstream = [0.0] * pp  # WAN round trips from stage s to the end
    for s in range(pp - 2, -1, -1):
        downstream[s] = downstream[s + 1] + round_trips[s]
    extra, prev = [], m
    for s in range(pp):
        rt = downstream[s]
        want = math.ceil(rt / max(fb_s[s], busy_s)) if rt else 0
        fits = int(free_gb[s] // act_gb[s]) if act_gb[s] > 0 else want
        e = max(0, min(want, fits, prev, m))
        extra.append(e)
        prev = e
    return extra


def kept_placement(plan: Plan) -> dict[str, list]:
    """`build_plan` arguments that keep this plan's placement in a later plan (a running job does not move its
    stages between DCs): the DC chain of a pipeline placement and the stages each DC runs, from the first
    replica (every replica runs the same chain); nothing for dp-wan, whose placement ignores the links."""
    if plan.mech.placement == "dp-wan":
        return {}
    order: list[str] = []
    counts: list[int] = []
    for d in plan.stage_dc[0]:
        if order and order[-1] == d:
            counts[-1] += 1
        else:
            order.append(d)
            counts.append(1)
    return {"order": order, "counts": counts}


def candidate_plans(exp: Experiment, scheduler: str, dp: int | None = None) -> list[Plan]:
    """Every distinct plan build_plan chooses among (the one plan of a fixed composition), built and not
    simulated: what a check of lowering covers without the choice's simulations. A candidate that cannot be
    placed is left out; none at all raises its SpecError, as build_plan does."""
    mech = parse_scheduler(scheduler)
    if not mech.auto:
        return [build_fixed(exp, scheduler, mech, dp=dp)]
    dp = dp or resolve_dp(exp)
    orders, sidecars = searched(exp, mech, dp)
    build, plans, seen, failed = builder(exp, scheduler, "run", dp), [], set(), None
    for pick in candidates(mech, dp, orders, sidecars):
        try:
            plan = build(resolved(mech, pick), pick)
        except SpecError as e:
            failed = e
            continue
        if (key := fingerprint(plan)) not in seen:
            seen.add(key)
            plans.append(plan)
    if not plans:
        assert failed is not None
        raise failed
    return plans


def searched(exp: Experiment, mech: Mechanisms, dp: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The turn orders and sidecars a plan with mechanisms left to it searches."""
    w = exp.workload
    m = max(1, w.global_batch // (w.microbatch * dp))
    orders = turn_orders(exp.network.turn_order, dp, m, w.schedule)
    # the handover is searched where the spec leaves it and the plan would be predictive (BubbleTea: reactive)
    sidecars = ("predictive", "reactive") if plan_sidecar(exp.network.sidecar, mech) == "predictive" \
        and exp.network.sidecar == "auto" else ("",)
    return orders, sidecars


def builder(exp: Experiment, scheduler: str, run_id: str, dp: int, order: list[str] | None = None,
             counts: list[int] | None = None, built: NetPlan | None = None) -> Callable[[Mechanisms, Pick], Plan]:
    """A candidate's plan: the fixed composition, with the pick's turn order and sidecar where it takes turns."""
    def build(resolved: Mechanisms, pick: Pick) -> Plan:
        plan = build_fixed(exp, scheduler, resolved, run_id, dp, order, counts, built)
        if resolved.temporal:
            plan.turn_policy = pick.order
            plan.sidecar = pick.sidecar or plan.sidecar
        return plan

    return build


def plannable(exp: Experiment, scheduler: str, dp: int | None = None) -> None:
    """Raises the plan's SpecError where `scheduler` cannot be planned (memory, DCs); for one that leaves
    mechanisms to the plan, where no candidate can. Builds plans only, simulates none."""
    mech = parse_scheduler(scheduler)
    if not mech.auto:
        build_fixed(exp, scheduler, mech, dp=dp)
        return
    dp = dp or resolve_dp(exp)
    failed: SpecError | None = None
    for pick in candidates(mech, dp, ("replica",)):
        try:
            build_fixed(exp, scheduler, resolved(mech, pick), dp=dp)
            return
        except SpecError as e:
            failed = e  # as choose: the last candidate's message
    assert failed is not None
    raise failed


def build_fixed(exp: Experiment, scheduler: str, mech: Mechanisms, run_id: str = "run", dp: int | None = None,
                order: list[str] | None = None, counts: list[int] | None = None, built: NetPlan | None = None
                ) -> Plan:
    """The plan of a fixed composition of mechanisms (`mech` with nothing left to choose) on the network
    `built` (as build_plan)."""
    w, topo = exp.workload, exp.topology
    model = resolve_model(w.model, w.seq_len)
    check_workload(exp, model)
    dp = dp or resolve_dp(exp)
    m = batch_share(exp, scheduler, mech, dp)
    if m < 1:
        raise SpecError("workload.global_batch", f"{w.global_batch} sequences cannot feed dp={dp} replicas",
                        "raise global_batch or lower dp")
    check_size(m, w.pp)
    if order is None:
        order, counts = pinned_chain(exp, mech)
    check_groups(exp, scheduler, mech)
    stage_dc = place(mech.placement, topo, w.pp, w.tp, dp, order, counts, w.groups)
    gpu_of = {d: topo.dc(d).gpu for row in stage_dc for d in row}
    check_nodes(topo, w.tp, set(gpu_of))
    V = w.virtual_stages
    check_schedule(scheduler, mech, w, m, dp)
    per_gpu, layers, costs, shares = stage_costs(model, mech, w, topo, stage_dc, gpu_of, dp, m)
    m = max(shares, default=m)
    check_size(m, w.pp)
    chunks = model_chunks(layers, V)
    ref = costs[0]
    net = lower_network(topo, built=built)
    links = link_plans(exp, mech, net)
    extra = warmup_extra(mech, w, topo, stage_dc[0], ref, links, dp, m)
    mem = [max(costs[r][s].mem_gb + extra[s] * costs[r][s].act_gb_per_microbatch for r in range(dp))
           for s in range(w.pp)]

    offsets = [0.0] * dp
    if mech.stagger:
        offsets = stagger_offsets(stage_dc[0], [c.act_bytes for c in ref], links, dp)
    plan = Plan(
        run_id=run_id,
        scheduler=scheduler,
        mech=mech,
        model=model.name,
        gpu_types={d.name: d.gpu for d in topo.dcs},
        tp=w.tp,
        pp=w.pp,
        dp=dp,
        microbatches=m,
        microbatch_size=w.microbatch,
        seq_len=model.seq_len,
        global_batch=w.global_batch,
        stage_dc=stage_dc,
        fwd_s=[[c.fwd_s for c in row] for row in costs],
        bwd_s=[[c.bwd_s for c in row] for row in costs],
        act_bytes=[c.act_bytes for c in ref],
        grad_bytes=[c.grad_bytes for c in ref],
        mem_gb=mem,
        actions=build_schedule(w.schedule, w.pp, m, extra if w.schedule == "1f1b" else None, V),
        links=links,
        net=net,
        # one NIC per GPU; a TP group's transfers and all-reduces are split across its tp NICs
        intra={d.name: IntraDC(gbps_to_bytes_s(w.tp * d.intra_gbps), d.intra_latency_us / 1e6) for d in topo.dcs},
        replica_offset_s=offsets,
        turn_order=list(range(dp)),
        nccl_sockets=exp.network.nccl_sockets,
        hosts={d.name: d.hosts for d in topo.dcs},
        layers=layers,
        optimizer_s=[[c.optimizer_s for c in row] for row in costs],
        model_flops_per_seq=model.seq_len * model_flops_per_token(model, model.seq_len),
        virtual_stages=V,
        chunk_layers=chunks,
        edge_grad_bytes=[(float(model.embedding_params() * BF16) if s == 0 else 0.0,
                          float(model.embedding_params() * BF16) if s == w.pp - 1 else 0.0) for s in range(w.pp)],
        bucket_bytes=bucket_bytes(w.ddp_bucket_params, dp, w.tp),
        replica_microbatches=shares,
        split_actions={k: build_schedule(w.schedule, w.pp, k, [min(e, k) for e in extra] if w.schedule == "1f1b"
                                         else None) for k in sorted(set(shares))},
    )
    split_times(plan, w, per_gpu, gpu_of)
    return finish_plan(plan, exp)


def finish_plan(plan: Plan, exp: Experiment) -> Plan:
    """What a plan decides from its own numbers: a low-communication sync period, the token efficiency, the turn
    policy."""
    w, mech, V = exp.workload, plan.mech, exp.workload.virtual_stages
    if mech.outer:
        if V > 1 or w.schedule == "zb":
            raise NotYetError(f"{plan.scheduler}: low-communication training with "
                              f"{'virtual_stages > 1' if V > 1 else 'the zero-bubble schedule'} is not supported "
                              "yet; use virtual_stages: 1 and schedule: 1f1b or gpipe")
        plan.diloco = resolve_diloco(mech.outer, w.diloco)
        check_period(plan)
    workers = len({tuple(row) for row in plan.stage_dc}) if w.groups else len(plan.dcs_used())  # DiLoCo's workers
    plan.token_efficiency = token_efficiency(mech.outer, workers, plan.diloco, w.token_efficiency)
    plan.turn_policy = turn_policy(exp.network.turn_order, plan)
    plan.sidecar = plan_sidecar(exp.network.sidecar, mech)
    return plan


def check_schedule(scheduler: str, mech: Mechanisms, w, m: int, dp: int) -> None:
    """The schedule can run this many microbatches per replica with these mechanisms, else the one-line error."""
    V = w.virtual_stages
    if why := check_interleaving(w.pp, m, V):
        raise SpecError("workload.virtual_stages", why,
                        "make global_batch / (microbatch x dp) a multiple of pp, or set virtual_stages: 1")
    if mech.overlap and dp > 1 and (V > 1 or w.schedule == "zb"):
        raise NotYetError(f"{scheduler}: the overlap mechanism's bucketed collectives with "
                          f"{'virtual_stages > 1' if V > 1 else 'the zero-bubble schedule'} are not supported yet; "
                          f"use {scheduler}-overlap, or virtual_stages: 1 and schedule: 1f1b")


def check_groups(exp: Experiment, scheduler: str, mech: Mechanisms) -> None:
    """`workload.groups` goes with a data-parallel family and without `replicas_per_dc`, else the one-line error."""
    w = exp.workload
    if not w.groups:
        return
    if mech.placement != "dp-wan":
        raise SpecError("workload.groups", f"{scheduler} is a pipeline family; groups put a pipeline inside each "
                        "group and data parallelism or DiLoCo across them", "run dp-wan, diloco or streaming-diloco "
                        "with groups, or leave workload.groups out")
    if w.replicas_per_dc:
        raise SpecError("workload.groups", "groups and replicas_per_dc both place the replicas",
                        "leave one of them out")
    if mech.temporal or mech.warmup or mech.bubbletea:
        raise SpecError("workload.groups", f"{scheduler}: +temporal, +warmup and +bubbletea on the pipeline inside a "
                        "group are not supported yet", "drop the mechanism (+mtcp applies), or leave groups out")


def check_size(m: int, pp: int) -> None:
    """One replica's program within what the simulator takes."""
    if m * pp > MAX_STAGE_MICROBATCHES:
        raise SpecError("workload.global_batch", f"{m:,} microbatches per replica x {pp} stages = {m * pp:,} "
                        f"stage microbatches in one replica's program, more than the simulator takes "
                        f"({MAX_STAGE_MICROBATCHES:,})", "lower global_batch or pp, or raise microbatch or dp")


def batch_share(exp: Experiment, scheduler: str, mech: Mechanisms, dp: int) -> int:
    """Microbatches per replica with the even split (the most one gets with the split by speed), refused where a
    pipeline family would need unequal shares."""
    w = exp.workload
    seqs = w.global_batch // w.microbatch
    if speed_split(w, mech):
        if w.virtual_stages > 1 or w.schedule == "zb":
            raise NotYetError(f"{scheduler}: the batch split by speed with "
                              f"{'virtual_stages > 1' if w.virtual_stages > 1 else 'the zero-bubble schedule'} is "
                              "not supported yet; use virtual_stages: 1 and schedule: 1f1b or gpipe, or batch_split: "
                              "even")
        return -(-seqs // dp)
    if seqs % dp:
        raise SpecError("workload.batch_split", f"{scheduler} runs every replica on the same DC chain, so it shares "
                        f"the batch evenly, and dp={dp} does not divide its {seqs} microbatches",
                        f"pick a dp dividing {seqs}, or run only data-parallel families (dp-wan, diloco)")
    return seqs // dp


def stage_costs(model: ModelConfig, mech: Mechanisms, w, topo: Topology, stage_dc: list[list[str]],
                gpu_of: dict[str, str], dp: int, m: int) -> tuple[dict, list[int], list[list], list[int]]:
    """Each GPU type's layer costs, the layers each stage holds, [replica][stage] the stage's costs on its
    group's GPU, and with the batch split by speed [replica] its microbatches (else empty); refused where a
    stage does not fit its GPU's memory at its replica's share."""
    V = w.virtual_stages
    per_gpu = {g: layer_costs(model, g, tp=w.tp, dp=dp, microbatch=w.microbatch, mfu=w.mfu, recompute=w.recompute,
                              distributed_optimizer=w.distributed_optimizer, sequence_parallel=w.sequence_parallel_at())
               for g in sorted(set(gpu_of.values()))}
    stage_gpus = [sorted({gpu_of[row[s]] for row in stage_dc}) for s in range(w.pp)]
    # dp-wan keeps the even split: its iteration is bound by each stage's gradient all-reduce over the WAN,
    # which balancing compute would make larger on the embedding's stage
    split = "even" if mech.placement == "dp-wan" else w.layer_split
    layers, _ = stage_layers(model.layers, [[per_gpu[g] for g in gs] for gs in stage_gpus], m, w.schedule, split, V)

    def at(k: int) -> dict[str, list]:  # every GPU type's stage costs with k microbatches per replica
        return {g: [c.stage(n, s == 0, s == w.pp - 1, in_flight(s, w.pp, k, w.schedule, V))
                    for s, n in enumerate(layers)] for g, c in per_gpu.items()}

    by_gpu = at(m)
    shares: list[int] = []
    if speed_split(w, mech):
        shares = split_by_speed(w.global_batch // w.microbatch, [[by_gpu[gpu_of[d]][s].fwd_s + by_gpu[gpu_of[d]][
            s].bwd_s for s, d in enumerate(row)] for row in stage_dc])
        per_share = {k: at(k) for k in sorted(set(shares))}
        check_shares(stage_dc, topo, per_share, shares)
        return per_gpu, layers, [[per_share[shares[r]][topo.dc(d).gpu][s] for s, d in enumerate(row)]
                                 for r, row in enumerate(stage_dc)], shares
    check_memory(stage_dc, topo, by_gpu)
    return per_gpu, layers, [[by_gpu[topo.dc(d).gpu][s] for s, d in enumerate(row)] for row in stage_dc], shares


def check_shares(stage_dc: list[list[str]], topo: Topology, per_share: dict[int, dict], shares: list[int]) -> None:
    """With the batch split by speed, every replica's stages fit its GPUs' memory at its share (GPipe holds every
    microbatch's activations, so a faster site's larger share needs more), else the one-line error naming the DC."""
    for r, row in enumerate(stage_dc):
        for s, d in enumerate(row):
            g = topo.dc(d).gpu
            need = per_share[shares[r]][g][s].mem_gb
            if need > GPUS[g].memory_gb:
                raise SpecError("workload.batch_split", f"DC {d}'s replicas take {shares[r]} microbatches each of "
                                f"the batch split by speed, and stage {s} then needs {need:.0f} GB per {g} GPU (it "
                                f"has {GPUS[g].memory_gb:.0f} GB)", "raise tp or pp, use schedule: 1f1b, lower "
                                "microbatch or global_batch, or set batch_split: even")


def warmup_extra(mech: Mechanisms, w, topo: Topology, row: list[str], ref: list, links: dict, dp: int,
                 m: int) -> list[int]:
    """The warm-up mechanism's extra microbatches per stage (latency_warmup) on the first replica's chain `row`
    with its stages' costs `ref`; none without the mechanism or with interleaving (Megatron's warm-up)."""
    if not mech.warmup or w.virtual_stages != 1:
        return [0] * w.pp
    free = [GPUS[topo.dc(d).gpu].memory_gb - c.mem_gb for d, c in zip(row, ref, strict=True)]
    trips, busy = wan_round_trips(row, [c.act_bytes for c in ref], links, dp)
    return latency_warmup([c.fwd_s + c.bwd_s for c in ref], trips, free, [c.act_gb_per_microbatch for c in ref],
                          m, w.schedule, busy)


def plan_sidecar(option: str, mech: Mechanisms) -> str:
    """`network.sidecar` for this plan. `auto` is predictive, except with BubbleTea: its realised run
    (sim/realised.py) delivers each arrival as an event of its own, and with handovers at the very instant a
    transfer is issued or done its training drifts from the bubbles taken from the plain run (2.7 % slower
    without noise on emu-bubbletea), so BubbleTea keeps the reactive sidecar until that is found."""
    if option == "auto":
        return "reactive" if mech.bubbletea else "predictive"
    return option


def check_memory(stage_dc: list[list[str]], topo: Topology, by_gpu: dict) -> None:
    """Every group's stage fits its GPU's memory, else the one-line error naming the fixes."""
    kinds = {topo.dc(d).gpu for row in stage_dc for d in row}
    for r_row in stage_dc:
        for s, d in enumerate(r_row):
            g = topo.dc(d).gpu
            need = by_gpu[g][s].mem_gb
            if need > GPUS[g].memory_gb:
                same = " (every DC runs the same tp and pp; a layout per site is not supported yet)" \
                    if len(kinds) > 1 else ""
                raise SpecError(
                    "workload",
                    f"stage {s} needs {need:.0f} GB per {g} GPU in {d} (it has {GPUS[g].memory_gb:.0f} GB){same}",
                    "raise tp or pp, set sequence_parallel: true or recompute: full, or lower microbatch",
                )


def model_chunks(layers: list[int], v: int) -> list[list[int]]:
    """[stage][chunk] layers with v virtual stages ([] with one), refused where a chunk would hold none."""
    if v == 1:
        return []
    chunks = chunk_layers(layers, v)
    if bad := empty_chunk(chunks):
        raise SpecError("workload.virtual_stages", f"stage {bad[0]}'s {layers[bad[0]]} layers leave chunk {bad[1]} "
                        f"of {v} empty", "lower virtual_stages or pp")
    return chunks


def split_times(plan: Plan, w, per_gpu: dict, gpu_of: dict[str, str]) -> None:
    """The plan's per-chunk times (virtual stages) and W times (zero-bubble), from each group's GPU costs."""
    if plan.virtual_stages > 1:
        plan.chunk_fwd_s, plan.chunk_bwd_s = chunk_times(plan.stage_dc, per_gpu, plan.chunk_layers, gpu_of)
    if w.schedule == "zb":
        plan.wgrad_s = [[weight_grad_s(per_gpu[gpu_of[d]], plan.layers[s], s == plan.pp - 1)
                         for s, d in enumerate(row)] for row in plan.stage_dc]


def chunk_times(stage_dc: list[list[str]], per_gpu: dict, chunks: list[list[int]], gpu_of: dict[str, str]
                ) -> tuple[list[list[list[float]]], list[list[list[float]]]]:
    """[replica][stage][chunk] forward and backward times of one microbatch through each model chunk on its
    group's GPU: its layers, plus the output head on the last stage's last chunk."""
    pp, fwd, bwd = len(chunks), [], []
    for row in stage_dc:
        f_row, b_row = [], []
        for s, d in enumerate(row):
            c = per_gpu[gpu_of[d]]
            v = len(chunks[s])
            costs = [c.stage(n, s == 0 and k == 0, s == pp - 1 and k == v - 1, 1) for k, n in enumerate(chunks[s])]
            f_row.append([x.fwd_s for x in costs])
            b_row.append([x.bwd_s for x in costs])
        fwd.append(f_row)
        bwd.append(b_row)
    return fwd, bwd


def weight_grad_s(c, layers: int, last: bool) -> float:
    """The weight-gradient part of a stage's backward (zero-bubble's W): per layer its weight-gradient GEMMs
    (costs/stage.py `wgrad_s`: with a typed mfu one GEMM pass as long as the forward's compute; with `auto`
    the operators' (k x m) @ (m x n) GEMMs at their shapes), and the output head's on the last stage. The rest
    of the backward (the input gradient, attention, memory-bound kernels, all-reduces, recomputation) is B."""
    return layers * c.wgrad_s + (c.head_wgrad_s if last else 0.0)


def check_period(plan: Plan) -> None:
    """A sync period's stage microbatches, as the simulator runs them (one replica per DC), within its bound."""
    n = len(plan.dcs_used()) * plan.microbatches * plan.pp * plan.steps_per_program
    if n > MAX_STAGE_MICROBATCHES * 4:
        raise SpecError("workload.diloco.inner_steps", f"a sync period of {plan.steps_per_program} inner steps is "
                        f"{n:,} stage microbatches to simulate, more than {MAX_STAGE_MICROBATCHES * 4:,}",
                        "lower inner_steps or global_batch")


def turn_policy(order: str, plan: Plan) -> str:
    """`auto`: when the WAN bounds the iteration (Plan.wan_load >= 1) one replica at a time gets the link
    (replica order), which keeps the link busy while the others compute; otherwise the earliest
    microbatch goes first, which keeps the pipelines in step (bench/turn_orders.py compares them)."""
    if order != "auto":
        return order
    return "replica" if plan.wan_load() >= 1 else "microbatch"

"""BubbleTea on a simulated (or emulated) training timeline: trace -> bubbles -> placements (bubbles or
the fallback pool) -> prefill intervals, requests.csv rows and summary metrics."""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import mean, quantiles

from testbed.bubbletea.bubbles import Bubble, extract_bubbles
from testbed.bubbletea.fill import fill_jobs, fill_memory_gb, fill_metrics, run_fill
from testbed.bubbletea.pool import FallbackPool, default_servers
from testbed.bubbletea.scheduler import GroupCost, Placement, schedule
from testbed.bubbletea.trace import Request, load_trace, synthetic_trace
from testbed.costs.gpus import GPUS
from testbed.costs.models import ModelConfig
from testbed.costs.prefill import inference_model, kv_bytes_per_token, pass_work, weights_gb
from testbed.costs.prefill_model import chunk_time_s, prefill_time_s
from testbed.errors import SpecError
from testbed.plan.plan import Plan
from testbed.results import fmt
from testbed.spec.experiment import BubbleTeaOptions
from testbed.timeline import Timeline, group_name

REQUESTS_HEADER = ("run_id", "source", "request_id", "arrival_s", "prompt_tokens", "gpu", "dc", "start_s", "end_s",
                   "ttft_s", "chunks", "in_bubble", "home_dc", "kv_bytes", "kv_ready_s", "queue_s", "pool_reason")
POOL_MEMORY_SHARE = 0.8  # a pool server's weights may take this share of its GPUs' memory (the rest: KV cache)


@dataclass
class BubbleTeaResult:
    timeline: Timeline
    placements: list[Placement]
    bubbles: list[Bubble]
    metrics: dict[str, object]
    pool: FallbackPool


@dataclass(frozen=True)
class Outcome:
    """One request as served, on whichever clock the run has (simulated or emulated)."""

    tokens: int
    ttft_s: float
    in_bubble: bool
    queue_s: float = 0.0


# --- requests -----------------------------------------------------------------------------------

def _whole_trace(opts: BubbleTeaOptions, seed: int) -> list[Request]:
    """The trace at its own rate (rate_scale 1): the file, or an hour of the synthetic one."""
    if opts.trace == "synthetic":
        return synthetic_trace(3600.0, seed=seed)
    return load_trace(opts.trace)


def trace_span_s(reqs: list[Request]) -> float:
    """How long the trace lasts: its last arrival plus one mean gap (so a loop keeps the mean rate)."""
    if not reqs:
        return 0.0
    last = reqs[-1].arrival_s
    return last + (last / (len(reqs) - 1) if len(reqs) > 1 and last > 0 else 1.0)


def requests_for(opts: BubbleTeaOptions, horizon_s: float, seed: int) -> list[Request]:
    """The requests arriving during the run: the trace compressed by rate_scale, from trace_start_s.
    A file trace shorter than the window is replayed from its start (so the offered rate stays the
    trace's, times rate_scale, at every sweep point)."""
    if opts.trace == "synthetic":
        return synthetic_trace(horizon_s, rate_scale=opts.rate_scale, seed=seed)
    whole = load_trace(opts.trace, rate_scale=opts.rate_scale)
    span = trace_span_s(whole)
    out: list[Request] = []
    lap = math.floor(opts.trace_start_s / span) if span > 0 else 0
    while span > 0:
        base = lap * span - opts.trace_start_s
        for q in whole:
            t = base + q.arrival_s
            if t >= horizon_s:
                return out
            if t >= 0:
                out.append(Request(len(out), t, q.prompt_tokens, q.output_tokens))
        lap += 1
    return out


# --- costs --------------------------------------------------------------------------------------

def free_gb(plan: Plan, opts: BubbleTeaOptions) -> dict[int, float]:
    """Per stage: GPU memory left beside training and the prefill model's weights."""
    model = inference_model(opts.model)
    return {s: GPUS[plan.gpu_types[plan.stage_dc[0][s]]].memory_gb - plan.mem_gb[s] - weights_gb(model, plan.tp)
            for s in range(plan.pp)}


def group_costs(plan: Plan, opts: BubbleTeaOptions, reserve_gb: float = 0.0
                ) -> tuple[dict[str, GroupCost], dict[int, int]]:
    """Per DC GPU type: prefill costs; per stage: the prompt tokens whose KV fits beside training (and
    `reserve_gb` kept for fill work)."""
    model, kind = inference_model(opts.model), opts.prefill_model
    kv_tok = kv_bytes_per_token(model) / plan.tp
    per_dc: dict[str, GroupCost] = {}
    max_tokens: dict[int, int] = {}
    for s, free in free_gb(plan, opts).items():
        max_tokens[s] = max(0, int((free - reserve_gb) * 1e9 / kv_tok))
    for dc in plan.dcs_used():
        gpu = plan.gpu_types[dc]
        per_dc[dc] = GroupCost(functools.lru_cache(maxsize=None)(
                                   lambda n, g=gpu: prefill_time_s(model, g, plan.tp, n, kind=kind)),
                               functools.lru_cache(maxsize=None)(
                                   lambda d, k, g=gpu: chunk_time_s(model, g, plan.tp, d, k, kind=kind)), 0)
    return per_dc, max_tokens


def pool_tp(model: ModelConfig, gpu: str) -> int:
    """GPUs per pool server: the fewest (1, 2, 4, 8) whose memory holds the weights with room for KV."""
    for tp in (1, 2, 4, 8):
        if weights_gb(model, tp) <= POOL_MEMORY_SHARE * GPUS[gpu].memory_gb:
            return tp
    raise SpecError("bubbletea.model", f"{model.name} does not fit on 8 {gpu}s", "pick a smaller inference model")


def fallback_pool(plan: Plan, opts: BubbleTeaOptions, seed: int) -> FallbackPool:
    """The pool of `opts.fallback_gpus` GPUs (default: sized for the trace's mean load at its own rate),
    in servers of `pool_tp` GPUs spread over the DCs in use."""
    model = inference_model(opts.model)
    dcs = plan.dcs_used()
    tps = {dc: pool_tp(model, plan.gpu_types[dc]) for dc in dcs}
    per = max(tps.values())
    times = {dc: functools.lru_cache(maxsize=None)(
        lambda n, g=plan.gpu_types[dc]: prefill_time_s(model, g, per, n, kind=opts.prefill_model)) for dc in dcs}
    if opts.fallback_gpus is None:
        whole = _whole_trace(opts, seed)
        rate = len(whole) / trace_span_s(whole) if whole else 0.0
        load = mean(times[dcs[0]](q.prompt_tokens) for q in whole) if whole else 0.0
        servers = default_servers(rate, load)
    else:
        if opts.fallback_gpus % per:
            raise SpecError("bubbletea.fallback_gpus", f"{opts.fallback_gpus} GPUs do not make whole servers of {per}",
                            f"use a multiple of {per} ({opts.model} needs {per} GPU(s) per server)")
        servers = opts.fallback_gpus // per
    return FallbackPool(servers, per, dcs, times)


def kv_transfer(plan: Plan, opts: BubbleTeaOptions):
    per_token = kv_bytes_per_token(inference_model(opts.model))

    def t(src: str, dst: str, tokens: int) -> float:
        nbytes = per_token * tokens
        if src == dst:
            intra = plan.intra[src]
            return intra.latency_s + nbytes / intra.bandwidth_bytes_s
        lp = plan.links.get((src, dst))
        if lp is None:
            return float("inf")
        return lp.latency_s + nbytes / lp.transfer_rate_bytes_s

    return t


def home_dcs(reqs: list[Request], dcs: list[str], seed: int) -> dict[int, str]:
    """Each request's decode pool: spread evenly over the DCs (seeded)."""
    rng = random.Random(seed)
    return {q.request_id: rng.choice(dcs) for q in reqs}


# --- the run ------------------------------------------------------------------------------------

def group_cost_table(plan: Plan, opts: BubbleTeaOptions, reserve_gb: float = 0.0
                     ) -> tuple[dict[tuple[str, str], GroupCost], dict[int, int]]:
    """Prefill costs per group that can hold any prompt beside training ((group, dc) -> GroupCost), and each
    stage's KV capacity in tokens; an inference model that fits nowhere is a spec error."""
    per_dc, max_tokens = group_costs(plan, opts, reserve_gb)
    if all(v == 0 for v in max_tokens.values()):
        raise SpecError("bubbletea.model", f"{opts.model} does not fit beside training on any stage's GPUs",
                        "pick a smaller inference model, or raise workload.tp")
    costs = {}
    for r in range(plan.dp):
        for s in range(plan.pp):
            if max_tokens[s]:
                dc = plan.stage_dc[r][s]
                costs[(group_name(s, r), dc)] = GroupCost(per_dc[dc].full, per_dc[dc].chunk, max_tokens[s])
    return costs, max_tokens


def run_bubbletea(plan: Plan, tl: Timeline, opts: BubbleTeaOptions, seed: int, train_mfu: float) -> BubbleTeaResult:
    """`train_mfu`: the training's achieved MFU, the yardstick of useful work (`train_mfu()`)."""
    horizon = sum(tl.iteration_s)
    reqs = requests_for(opts, horizon, seed)
    bubbles = extract_bubbles(tl)
    jobs = fill_jobs(opts.fill, horizon, seed) if opts.fill else []
    reserve = fill_memory_gb(opts.fill, opts.model, plan.tp, jobs) if opts.fill else 0.0
    costs, max_tokens = group_cost_table(plan, opts, reserve)
    homes = home_dcs(reqs, plan.dcs_used(), seed)
    if opts.jitter_compute_cv or opts.jitter_wan_cv:
        return _realised(plan, tl, reqs, homes, costs, bubbles, opts, seed, train_mfu, max(max_tokens.values()))
    pool = fallback_pool(plan, opts, seed)
    placements = schedule(reqs, bubbles, costs=costs, pool=pool, kv_time=kv_transfer(plan, opts),
                          home=lambda q: homes[q.request_id], guard_s=opts.guard_ms / 1e3,
                          slo_s=opts.ttft_slo_ms / 1e3, horizon_s=horizon)
    per_token = kv_bytes_per_token(inference_model(opts.model))
    m: dict[str, object] = {}
    if any(not p.fallback for p in placements):  # realised: the KV flows share the WAN with training
        from testbed.bubbletea.realised import replay

        merged, durations, base = replay(plan, placements, tl.iteration_s[0], len(tl.iteration_s),
                                         inference_model(opts.model).layers, per_token)
        m["train_slowdown"] = round(sum(durations) / (base * len(durations)) - 1, 9)  # the whole run, as before
        horizon = sum(durations)
    else:
        merged = tl
    outcomes = [Outcome(p.request.prompt_tokens, p.ttft_s, not p.fallback, p.queue_s) for p in placements]
    work = useful_work(plan, opts, [(p.dc, iv) for p in placements if not p.fallback for iv in chunks_of(p)],
                       horizon, train_mfu)
    m.update({**serving_metrics(outcomes, horizon, opts.ttft_slo_ms / 1e3), **pool_metrics(pool, horizon), **work,
              **kv_wan_metrics(plan, placements, per_token, horizon),
              "bubbles": len(bubbles), "kv_capacity_tokens": max(max_tokens.values())})
    if opts.fill:
        fits = {s: free >= reserve for s, free in free_gb(plan, opts).items()}
        done = run_fill(plan, merged, opts.fill, jobs, opts.guard_ms / 1e3, fits, opts.prefill_model)
        merged = merged.with_busy(done.intervals)
        m.update(fill_metrics(done, horizon, plan.pp * plan.dp, plan.tp, train_mfu))
    return BubbleTeaResult(merged, placements, bubbles, m, pool)


def _realised(plan: Plan, tl: Timeline, reqs: list[Request], homes: dict[int, str], costs: dict,
              bubbles: list[Bubble], opts: BubbleTeaOptions, seed: int, train_mfu: float, kv_tokens: int
              ) -> BubbleTeaResult:
    """The online planner against jittered iterations (testbed/bubbletea/realised.py); requests the
    bubbles did not serve queue in the pool from when the planner gave up on them."""
    from testbed.bubbletea.realised import realised_run, slowdown

    layers = inference_model(opts.model).layers
    kv_time = kv_transfer(plan, opts)
    per_token = kv_bytes_per_token(inference_model(opts.model))
    timeline, real, joins, durations, base, chunks = realised_run(plan, reqs, homes, costs, kv_time, opts, seed,
                                                                  len(tl.iteration_s), layers, per_token)
    pool = fallback_pool(plan, opts, seed)
    queued = sorted((joins.get(p.request.request_id, p.request.arrival_s), p.request.arrival_s, i)
                    for i, p in enumerate(real) if p.fallback)
    for join, _a, i in queued:
        p = real[i]
        served = pool.serve(join, p.request.prompt_tokens, p.home_dc)
        p.dc, p.end_s, p.queue_s = served.dc, served.end_s, served.start_s - p.request.arrival_s
        p.kv_ready_s = served.end_s + kv_time(served.dc, p.home_dc, p.request.prompt_tokens)
    horizon = sum(durations)
    outcomes = [Outcome(p.request.prompt_tokens, p.ttft_s, not p.fallback, p.queue_s) for p in real]
    m = {**serving_metrics(outcomes, horizon, opts.ttft_slo_ms / 1e3), **pool_metrics(pool, horizon),
         **useful_work(plan, opts, chunks, horizon, train_mfu), **kv_wan_metrics(plan, real, per_token, horizon),
         "bubbles": len(bubbles),
         "kv_capacity_tokens": kv_tokens, "train_slowdown": round(slowdown(durations, base), 9)}
    return BubbleTeaResult(timeline, real, bubbles, m, pool)


def chunks_of(p: Placement) -> list[tuple[float, float, int, int]]:
    """(start, end, tokens, tokens already cached) of each chunk of a bubble-served request."""
    out, done = [], 0
    for a, b, k in p.intervals:
        out.append((a, b, k, done))
        done += k
    return out


# --- metrics ------------------------------------------------------------------------------------

def _pct(values: list[float], p: int) -> float | str:
    """The p-th percentile (inclusive method), or empty when there are no values."""
    if not values:
        return ""
    v = sorted(values)
    if len(v) == 1:
        return v[0]
    return quantiles(v, n=100, method="inclusive")[p - 1]


def _ms(x: float | str) -> float | str:
    return round(x * 1e3, 3) if isinstance(x, float) else x


def serving_metrics(outcomes: list[Outcome], horizon_s: float, slo_s: float) -> dict[str, object]:
    """Request-level metrics, the same for simulated and emulated runs. TTFT includes the pool's queue."""
    n = len(outcomes)
    bubble = [o.ttft_s for o in outcomes if o.in_bubble]
    pool = [o for o in outcomes if not o.in_bubble]
    met = sum(o.ttft_s <= slo_s + 1e-9 for o in outcomes)
    ttft = [o.ttft_s for o in outcomes]
    return {
        "requests": n,
        "request_rate": round(n / horizon_s, 3) if horizon_s > 0 else 0.0,
        "fallback": len(pool),
        "served_in_bubbles": round(len(bubble) / n, 6) if n else 0.0,
        "ttft_p50_ms": _ms(_pct(ttft, 50)) if n else 0.0,
        "ttft_p99_ms": _ms(_pct(ttft, 99)) if n else 0.0,
        "ttft_bubble_p50_ms": _ms(_pct(bubble, 50)),
        "ttft_bubble_p99_ms": _ms(_pct(bubble, 99)),
        "ttft_pool_p50_ms": _ms(_pct([o.ttft_s for o in pool], 50)),
        "ttft_pool_p99_ms": _ms(_pct([o.ttft_s for o in pool], 99)),
        "pool_wait_p99_ms": _ms(_pct([o.queue_s for o in pool], 99)),
        "slo_attainment": round(met / n, 6) if n else 0.0,
        "goodput_rps": round(met / horizon_s, 3) if horizon_s > 0 else 0.0,
        "prefill_tokens_per_s": round(sum(o.tokens for o in outcomes if o.in_bubble) / horizon_s, 3),
    }


def kv_wan_links(placements: list[Placement], kv_per_token: float) -> dict[tuple[str, str], float]:
    """Bytes of KV cache that bubble-served prefill puts on each WAN link direction (group's DC -> home DC)."""
    out: dict[tuple[str, str], float] = {}
    for p in placements:
        if not p.fallback and p.dc != p.home_dc:
            out[(p.dc, p.home_dc)] = out.get((p.dc, p.home_dc), 0.0) + kv_per_token * p.request.prompt_tokens
    return out


def kv_wan_metrics(plan: Plan, placements: list[Placement], kv_per_token: float, horizon_s: float
                   ) -> dict[str, object]:
    """What prefill adds to the WAN: its KV bytes on all links, and on the busiest link its mean Gbit/s over the
    run and share of the link's capacity; how long shipping took (prefill end -> cache in the home DC)."""
    links = kv_wan_links(placements, kv_per_token)
    busiest = max(sorted(links), key=lambda k: links[k]) if links else None
    ship = [p.kv_ready_s - p.end_s for p in placements if not p.fallback and p.dc != p.home_dc]
    gbps = links[busiest] * 8 / horizon_s / 1e9 if busiest and horizon_s > 0 else 0.0
    cap = plan.links[busiest].capacity_bytes_s * 8 / 1e9 if busiest and busiest in plan.links else 0.0
    return {"kv_wan_bytes": int(sum(links.values())),
            "kv_wan_gbps": round(gbps, 6),
            "kv_wan_link": f"{busiest[0]}>{busiest[1]}" if busiest else "",
            "kv_wan_link_share": round(gbps / cap, 6) if cap else "",
            "kv_ship_p50_ms": _ms(_pct(ship, 50)),
            "kv_ship_p99_ms": _ms(_pct(ship, 99))}


def pool_metrics(pool: FallbackPool, horizon_s: float) -> dict[str, object]:
    return {"fallback_gpus": pool.gpus, "pool_util": round(pool.busy_share(horizon_s), 6)}


def useful_work(plan: Plan, opts: BubbleTeaOptions, chunks: Iterable[tuple[str, tuple[float, float, int, int]]],
                horizon_s: float, train_mfu: float) -> dict[str, object]:
    """Prefill as useful work on the training GPUs: its FLOPs, as the GPU time they would take at the
    training's achieved MFU (`prefill_work_util`), and the MFU prefill itself achieved in the bubbles
    (`prefill_mfu`). Time occupancy (`prefill_util`) overstates prefill by train_mfu / prefill_mfu."""
    model = inference_model(opts.model)
    gpu_s = horizon_s * plan.pp * plan.dp * plan.tp
    flops_at_train = busy_peak = flops = 0.0
    for dc, (a, b, k, done) in chunks:
        f = pass_work(model, 1, k, done).flops
        peak = GPUS[plan.gpu_types[dc]].peak_tflops * 1e12
        flops += f
        flops_at_train += f / (peak * train_mfu)
        busy_peak += (b - a) * plan.tp * peak
    return {"prefill_work_util": round(flops_at_train / gpu_s, 6) if gpu_s else 0.0,
            "prefill_mfu": round(flops / busy_peak, 6) if busy_peak else ""}


def train_mfu(workload_mfu: float | str, tp: int, plan: Plan | None = None) -> float:
    """The MFU of the training's compute ops: the cost model runs them at `workload.mfu` (its tensor-parallel
    all-reduces are timed apart, testbed/costs/stage.py), whatever the TP. With `mfu: auto` it is derived
    from the plan: one microbatch's model FLOPs over its compute time on every stage of the first replica."""
    if workload_mfu != "auto":
        return float(workload_mfu)
    if plan is None or not plan.model_flops_per_seq:
        raise ValueError("train_mfu: workload.mfu is auto but no plan with model_flops_per_seq was given")
    busy = sum((f + b) * tp * GPUS[plan.gpu_types[d]].peak_tflops * 1e12
               for f, b, d in zip(plan.fwd_s[0], plan.bwd_s[0], plan.stage_dc[0], strict=True))
    return plan.model_flops_per_seq * plan.microbatch_size / busy


def request_rows(run_id: str, source: str, pls: list[Placement], kv_per_token: float):
    for p in pls:
        q = p.request
        yield (run_id, source, q.request_id, fmt(q.arrival_s, 6), q.prompt_tokens, p.gpu, p.dc, fmt(p.start_s, 6),
               fmt(p.end_s, 6), fmt(p.ttft_s, 6), len(p.intervals), int(not p.fallback), p.home_dc,
               int(kv_per_token * q.prompt_tokens), fmt(p.kv_ready_s, 6), fmt(p.queue_s, 6),
               p.pool_reason if p.fallback else "")


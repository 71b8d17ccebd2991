"""BubbleTea on a simulated (or emulated) training timeline: trace -> bubbles -> placements ->
prefill intervals, requests.csv rows and summary metrics."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from statistics import quantiles

from testbed.bubbletea.bubbles import Bubble, extract_bubbles
from testbed.bubbletea.scheduler import GroupCost, Placement, schedule
from testbed.bubbletea.trace import Request, load_trace, synthetic_trace
from testbed.costs.gpus import GPUS
from testbed.costs.prefill import chunk_time_s, inference_model, kv_bytes_per_token, prefill_time_s, weights_gb
from testbed.errors import SpecError
from testbed.plan.plan import Plan
from testbed.results import fmt
from testbed.spec.experiment import BubbleTeaOptions
from testbed.timeline import Interval, Timeline

REQUESTS_HEADER = ("run_id", "source", "request_id", "arrival_s", "prompt_tokens", "gpu", "dc", "start_s", "end_s",
                   "ttft_s", "chunks", "in_bubble", "home_dc", "kv_bytes", "kv_ready_s")


@dataclass
class BubbleTeaResult:
    timeline: Timeline
    placements: list[Placement]
    bubbles: list[Bubble]
    metrics: dict[str, object]


def requests_for(opts: BubbleTeaOptions, horizon_s: float, seed: int) -> list[Request]:
    if opts.trace == "synthetic":
        return synthetic_trace(horizon_s, rate_scale=opts.rate_scale, seed=seed)
    return load_trace(opts.trace, rate_scale=opts.rate_scale, start_s=opts.trace_start_s, duration_s=horizon_s)


def group_costs(plan: Plan, opts: BubbleTeaOptions) -> tuple[dict[str, GroupCost], dict[int, int]]:
    """Per DC GPU type: prefill costs; per stage: the prompt tokens whose KV fits beside training."""
    model = inference_model(opts.model)
    kv_tok = kv_bytes_per_token(model) / plan.tp
    per_dc: dict[str, GroupCost] = {}
    max_tokens: dict[int, int] = {}
    for s in range(plan.pp):
        gpu = plan.gpu_types[plan.stage_dc[0][s]]
        free = GPUS[gpu].memory_gb - plan.mem_gb[s] - weights_gb(model, plan.tp)
        max_tokens[s] = max(0, int(free * 1e9 / kv_tok))
    for dc in plan.dcs_used():
        gpu = plan.gpu_types[dc]
        per_dc[dc] = GroupCost(functools.lru_cache(maxsize=None)(lambda n, g=gpu: prefill_time_s(model, g, plan.tp, n)),
                               functools.lru_cache(maxsize=None)(
                                   lambda d, k, g=gpu: chunk_time_s(model, g, plan.tp, d, k)), 0)
    return per_dc, max_tokens


def kv_transfer(plan: Plan, opts: BubbleTeaOptions):
    per_token = kv_bytes_per_token(inference_model(opts.model))

    def t(src: str, dst: str, tokens: int) -> float:
        nbytes = per_token * tokens
        if src == dst:
            intra = plan.intra[src]
            return intra.latency_s + nbytes / intra.bandwidth_bps
        lp = plan.links.get((src, dst))
        if lp is None:
            return float("inf")
        return lp.latency_s + nbytes / lp.transfer_rate_bps

    return t


def run_bubbletea(plan: Plan, tl: Timeline, opts: BubbleTeaOptions, seed: int) -> BubbleTeaResult:
    horizon = sum(tl.iteration_s)
    reqs = requests_for(opts, horizon, seed)
    bubbles = extract_bubbles(tl)
    per_dc, max_tokens = group_costs(plan, opts)
    if all(v == 0 for v in max_tokens.values()):
        raise SpecError("bubbletea.model", f"{opts.model} does not fit beside training on any stage's GPUs",
                        "pick a smaller inference model, or raise workload.tp")
    costs = {}
    for r in range(plan.dp):
        for s in range(plan.pp):
            if max_tokens[s]:
                dc = plan.stage_dc[r][s]
                costs[(f"s{s}r{r}", dc)] = GroupCost(per_dc[dc].full, per_dc[dc].chunk, max_tokens[s])
    dcs = plan.dcs_used()
    rng = random.Random(seed)
    homes = {q.request_id: rng.choice(dcs) for q in reqs}  # decode pools spread evenly over the DCs
    placements = schedule(reqs, bubbles, costs=costs, fallback={d: per_dc[d].full for d in dcs},
                          kv_time=kv_transfer(plan, opts), home=lambda q: homes[q.request_id],
                          guard_s=opts.guard_ms / 1e3, slo_s=opts.ttft_slo_ms / 1e3, horizon_s=horizon)
    T = tl.iteration_s[0]
    extra = []
    for pl in placements:
        if pl.fallback:
            continue
        s, r = (int(x) for x in pl.gpu[1:].split("r"))
        for a, b, _tok in pl.intervals:
            extra.append(Interval(min(int(a // T), len(tl.iteration_s) - 1), pl.gpu, pl.dc, s, r, "prefill", -1, a, b,
                                  0.0))
    merged = tl.with_busy(extra)
    return BubbleTeaResult(merged, placements, bubbles, metrics(merged, placements, opts, horizon, len(bubbles),
                                                                max(max_tokens.values())))


def serving_metrics(ttft_ms: list[float], served_tokens: list[int], requests: int, horizon: float,
                    slo_ms: float) -> dict[str, object]:
    """Request-level metrics, the same for simulated and emulated runs."""
    ttft = sorted(ttft_ms)
    q = quantiles(ttft, n=100, method="inclusive") if len(ttft) > 1 else ttft * 99
    return {
        "requests": requests,
        "request_rate": round(requests / horizon, 3),
        "fallback": requests - len(served_tokens),
        "served_in_bubbles": round(len(served_tokens) / requests, 6) if requests else 0.0,
        "ttft_p50_ms": round(q[49], 3) if ttft else 0.0,
        "ttft_p99_ms": round(q[98], 3) if ttft else 0.0,
        "slo_attainment": round(sum(t <= slo_ms for t in ttft) / len(ttft), 6) if ttft else 0.0,
        "prefill_tokens_per_s": round(sum(served_tokens) / horizon, 3),
    }


def metrics(tl: Timeline, pls: list[Placement], opts: BubbleTeaOptions, horizon: float, nbubbles: int,
            kv_tokens: int) -> dict[str, object]:
    served = [p.request.prompt_tokens for p in pls if not p.fallback]
    return {**serving_metrics([p.ttft_s * 1e3 for p in pls], served, len(pls), horizon, opts.ttft_slo_ms),
            "bubbles": nbubbles, "kv_capacity_tokens": kv_tokens}


def request_rows(run_id: str, source: str, pls: list[Placement], kv_per_token: float):
    for p in pls:
        q = p.request
        yield (run_id, source, q.request_id, fmt(q.arrival_s, 6), q.prompt_tokens, p.gpu, p.dc, fmt(p.start_s, 6),
               fmt(p.end_s, 6), fmt(p.ttft_s, 6), len(p.intervals), int(not p.fallback), p.home_dc,
               int(kv_per_token * q.prompt_tokens), fmt(p.kv_ready_s, 6))

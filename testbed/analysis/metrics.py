"""Metrics computed from a Timeline, identically for simulated and emulated runs."""

from __future__ import annotations

from statistics import mean

from testbed.analysis.wanbytes import wan_bytes
from testbed.costs.gpus import GPUS
from testbed.net.units import bytes_s_to_gbps, s_to_ms
from testbed.plan.plan import Plan
from testbed.spec.mechanisms import is_baseline
from testbed.timeline import COMPUTE, Timeline

SUMMARY_HEADER = (
    "run_id", "source", "scheduler", "model", "dcs", "gpus", "tp", "pp", "dp", "microbatches",
    "wan_latency_ms", "wan_gbps", "tcp_connections", "iteration_s", "tokens_per_s", "tokens_per_s_per_gpu",
    "mfu", "model_tflops_per_gpu",
    "token_efficiency", "effective_tokens_per_s", "wan_bytes",
    "gpu_util", "train_util", "prefill_util", "prefill_work_util", "useful_util", "prefill_mfu", "bubble_frac",
    "lower_bound_s", "wan_min_s", "best_baseline", "speedup_vs_best",
    "train_slowdown", "train_slowdown_p25", "train_slowdown_p75", "ttft_p50_ms", "ttft_p99_ms", "ttft_bubble_p50_ms",
    "ttft_bubble_p99_ms", "ttft_pool_p50_ms",
    "ttft_pool_p99_ms", "pool_wait_p99_ms", "slo_attainment", "goodput_rps", "prefill_tokens_per_s",
    "served_in_bubbles", "requests", "request_rate", "fallback", "fallback_gpus", "pool_util", "prefill_skipped",
    "scale", "sweep", "degraded", "status",
)
BUBBLETEA_COLUMNS = ("prefill_work_util", "prefill_mfu", "train_slowdown", "train_slowdown_p25",
                     "train_slowdown_p75", "ttft_p50_ms", "ttft_p99_ms",
                     "ttft_bubble_p50_ms", "ttft_bubble_p99_ms", "ttft_pool_p50_ms", "ttft_pool_p99_ms",
                     "pool_wait_p99_ms", "slo_attainment", "goodput_rps", "prefill_tokens_per_s", "served_in_bubbles",
                     "requests", "request_rate", "fallback", "fallback_gpus", "pool_util", "prefill_skipped")
# what BubbleTea's KV caches add to the WAN (testbed/bubbletea/run.py kv_wan_metrics): written after SUMMARY_HEADER,
# only when a row has them, so runs without BubbleTea keep their summary as it was
KV_WAN_COLUMNS = ("kv_wan_bytes", "kv_wan_gbps", "kv_wan_link", "kv_wan_link_share", "kv_ship_p50_ms",
                  "kv_ship_p99_ms")
# the emulated run's KV caches that had not reached their decode process when it stopped (emulated BubbleTea with
# shipped caches only: written after KV_WAN_COLUMNS, only when a row has it)
KV_EMU_COLUMNS = ("kv_not_arrived",)
# BubbleTea's fill work (testbed/bubbletea/fill.py): written after KV_EMU_COLUMNS, only when a row has them
FILL_COLUMNS = ("fill_util", "fill_work_util", "fill_mfu", "fill_jobs", "fill_jobs_met", "fill_jobs_open",
                "fill_deadline_met", "fill_goodput_jobs_per_s", "fill_goodput_tokens_per_s")
# an emulated BubbleTea run against the separate run of training alone (`train_slowdown` is measured inside the
# run: testbed/bubbletea/without_prefill.py); written last, only when a row has it
SLOWDOWN_EMU_COLUMNS = ("train_slowdown_vs_alone", "train_slowdown_vs_alone_p25", "train_slowdown_vs_alone_p75")
# an emulated run's timing health and the iteration-time error it can cause (testbed/emu/health.py): written last,
# only when a row has them
HEALTH_COLUMNS = ("wait_late_ms", "wait_late_host_ms", "wait_late_max_ms", "wake_late_ms", "delay_lag_ms",
                  "delay_lag_max_ms", "cpu_steal", "cpu_pressure", "run_queue", "run_queue_max", "shaping_drops",
                  "bubbletea_cpu", "timing_error", "timing_budget", "cpu_class")


def share(tl: Timeline, kinds: tuple[str, ...]) -> float:
    """Share of GPU-group time spent in `kinds`, over all iterations."""
    total = sum(tl.iteration_s) * tl.groups
    if total <= 0:
        return 0.0
    return tl.busy_time(kinds) / total


def wan_links_used(plan: Plan) -> list[tuple[str, str]]:
    """Directed WAN hops the plan's traffic crosses (pipeline neighbours, or the DC ring for dp-wan)."""
    if plan.mech.placement == "dp-wan":
        ring = plan.dc_ring()
        if len(ring) < 2:
            return []
        return list(zip(ring, ring[1:] + ring[:1], strict=True))
    hops: list[tuple[str, str]] = []
    for a, b in zip(plan.stage_dc[0], plan.stage_dc[0][1:], strict=False):
        if a != b:
            hops += [(a, b), (b, a)]
    return hops


def wan_min_s(plan: Plan) -> float:
    """Time the busiest WAN link direction needs just to carry one iteration's bytes at capacity."""
    return plan.wan_busiest_s()


def model_flops(plan: Plan, iteration_s: float) -> dict[str, object]:
    """Derived MFU (model FLOPs of the iteration / its time / the peak of the GPUs that ran it) and model
    TFLOP/s per GPU; empty where the plan has no FLOP count or no time."""
    if not plan.model_flops_per_seq or iteration_s <= 0:
        return {"mfu": "", "model_tflops_per_gpu": ""}
    per_gpu = plan.global_batch * plan.model_flops_per_seq / iteration_s / plan.gpus
    peaks = [GPUS[plan.gpu_types[d]].peak_tflops * 1e12 for row in plan.stage_dc for d in row]
    return {"mfu": round(per_gpu / (sum(peaks) / len(peaks)), 6), "model_tflops_per_gpu": round(per_gpu / 1e12, 6)}


def summary_row(plan: Plan, tl: Timeline, lower_bound_s: float, sweep: dict, bubbletea: dict[str, object] | None = None,
                degraded: str = "", scale: float = 1.0) -> dict[str, object]:
    """One summary row; `scale`: the emulation's factor k for the rows of an emulated experiment (1 in the
    simulator; the plan itself is always in real-world units).
    `gpu_util` counts training, prefill and fill time; `useful_util` counts training time plus
    prefill and fill FLOPs at the training's MFU. BubbleTea columns are empty without it."""
    it = mean(tl.iteration_s) / plan.steps_per_program  # a sync period's program runs H iterations
    hops = wan_links_used(plan)
    lat = s_to_ms(mean(plan.links[h].latency_s for h in hops)) if hops else 0.0
    gbps = bytes_s_to_gbps(min(plan.links[h].capacity_bytes_s for h in hops)) if hops else 0.0
    conns = max((plan.links[h].connections for h in hops), default=0)
    tokens = plan.global_batch * plan.seq_len / it if it > 0 else 0.0
    return {
        "run_id": plan.run_id,
        "source": tl.source,
        "scheduler": plan.scheduler,
        "model": plan.model,
        "dcs": "|".join(plan.dcs_used()),
        "gpus": plan.gpus,
        "tp": plan.tp,
        "pp": plan.pp,
        "dp": plan.dp,
        "microbatches": plan.microbatches,
        "wan_latency_ms": round(lat, 6),
        "wan_gbps": round(gbps, 6),  # plan links are real-world; emulation divides by scale when it builds
        "tcp_connections": conns,
        "iteration_s": round(it, 6),
        "tokens_per_s": round(tokens, 3),
        "tokens_per_s_per_gpu": round(tokens / plan.gpus, 6),
        **model_flops(plan, it),
        "token_efficiency": plan.token_efficiency,
        "effective_tokens_per_s": round(tokens * plan.token_efficiency, 3),
        "wan_bytes": round(wan_bytes(plan), 3),
        "gpu_util": round(share(tl, (*COMPUTE, "prefill", "fill")), 6),
        "train_util": round(share(tl, COMPUTE), 6),
        "prefill_util": round(share(tl, ("prefill",)), 6),
        "useful_util": (round(share(tl, COMPUTE) + float(bubbletea["prefill_work_util"])
                              + float(bubbletea.get("fill_work_util", 0.0)), 6)
                        if bubbletea and bubbletea.get("prefill_work_util", "") != "" else ""),
        "bubble_frac": round(share(tl, ("idle",)), 6),
        "lower_bound_s": round(lower_bound_s, 6),
        "wan_min_s": round(wan_min_s(plan), 6),
        "best_baseline": "",  # filled per sweep point by add_speedups
        "speedup_vs_best": "",
        **{k: (bubbletea or {}).get(k, "") for k in BUBBLETEA_COLUMNS},
        **{k: bubbletea[k] for k in KV_WAN_COLUMNS + KV_EMU_COLUMNS + FILL_COLUMNS if bubbletea and k in bubbletea},
        "scale": scale,
        "sweep": ";".join(f"{k}={v}" for k, v in sweep.items()),
        "degraded": degraded,
        "status": "ok",
        # the mechanisms the plan chose (plan/choose.py), on rows whose scheduler leaves them to it
        **({"mechanisms": plan.meta["mechanisms"]} if "mechanisms" in plan.meta else {}),
    }


def add_speedups(rows: list[dict[str, object]]) -> None:
    """Per (source, sweep point): the fastest baseline (any scheduler but Atlas, mechanisms included), and
    every row's speedup over it (its iteration time / the row's). Empty where the point has no baseline."""
    groups: dict[tuple, list[dict[str, object]]] = {}
    for r in rows:
        if isinstance(r.get("iteration_s"), float | int) and float(r["iteration_s"]) > 0:  # type: ignore[arg-type]
            groups.setdefault((r["source"], r["sweep"]), []).append(r)
    for group in groups.values():
        base = [r for r in group if is_baseline(str(r["scheduler"]))]
        if not base:
            continue
        best = min(base, key=lambda r: (float(r["iteration_s"]), str(r["scheduler"])))  # type: ignore[arg-type]
        for r in group:
            r["best_baseline"] = best["scheduler"]
            r["speedup_vs_best"] = round(float(best["iteration_s"]) / float(r["iteration_s"]), 6)  # type: ignore

"""BubbleTea in an emulated run, the orchestrator's part: the service's configuration (requests,
workers' prefill costs, KV paths), the prefill model fitted to this CPU for real compute, and the
served requests and serving metrics from what the service recorded.

The emulated run's clock is its timeline: iterations back to back, each from its start to its last
op (prefill included), iteration 0 (warm-up) first; requests arrive from iteration 1's start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from statistics import median

from testbed.bubbletea.online import pool_reason
from testbed.bubbletea.run import (
    Outcome,
    fallback_pool,
    group_costs,
    home_dcs,
    pool_metrics,
    requests_for,
    serving_metrics,
    useful_work,
)
from testbed.bubbletea.trace import Request
from testbed.costs.gpu_specs import describe_gpu
from testbed.costs.prefill import (
    Calibration,
    PassWork,
    fit_calibration,
    inference_model,
    kv_bytes_per_token,
    pass_time_s,
    pass_work,
    spread,
)
from testbed.plan.plan import Plan
from testbed.spec.experiment import Experiment
from testbed.timeline import group_name

DECODE_PORT = 7900
DECODE_TOKENS = 4
CPU = "cpu"  # the prefill "GPU" of real compute on this machine (no datasheet: its calibration is all)


@dataclass
class CpuCalibration:
    calibration: Calibration
    rows: list[tuple[int, int, float, float, float]]  # tokens, cached, measured s, held-out predicted s, rel. error

    @property
    def held_out(self) -> tuple[float, float]:
        return spread([r[4] for r in self.rows])


def calibrate_cpu(model_name: str, repeats: int = 5) -> CpuCalibration:
    """Time real prefill passes of `model_name` (testbed/runtime/tiny_llama.py, one thread, like the
    workers) on this CPU, fit the roofline's overhead and FLOP rate, and score each measured pass by a
    fit without it (leave one out)."""
    import torch

    from testbed.runtime.tiny_llama import TinyLlama, prompt_ids

    torch.set_num_threads(1)
    m = inference_model(model_name)
    net = TinyLlama(m)
    shapes = [(n, 0) for n in (32, 64, 128, 256, 512, 768, 1024, 1536, 2048)] + [(256, 512), (512, 1024), (256, 1536)]
    samples: list[tuple[PassWork, float]] = []
    for tokens, cached in shapes:
        ids = prompt_ids(0, tokens + cached, m.vocab)
        past = net.prefill(ids[:cached])[1] if cached else None
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            net.prefill(ids[cached:], past)
            best = min(best, time.perf_counter() - t)
        samples.append((pass_work(m, 1, tokens, cached), best))
    rows = []
    for i, (w, t) in enumerate(samples):
        cal = fit_calibration(samples[:i] + samples[i + 1:], CPU, attention=True)
        pred = pass_time_s(w, CPU, cal)
        rows.append((shapes[i][0], shapes[i][1], t, pred, abs(pred / t - 1)))
    return CpuCalibration(fit_calibration(samples, CPU, attention=True), rows)


def service_config(plan: Plan, exp: Experiment, horizon_s: float, cal: Calibration | None) -> tuple[dict, list]:
    """The service's configuration and the requests it serves (arrivals from iteration 1's start)."""
    from testbed.bubbletea.run import kv_transfer

    opts = exp.bubbletea
    reqs = requests_for(opts, horizon_s, exp.seed)
    homes = home_dcs(reqs, plan.dcs_used(), exp.seed)
    _per_dc, max_tokens = group_costs(plan, opts)
    workers = {}
    for r in range(plan.dp):
        for s in range(plan.pp):
            if max_tokens[s]:
                dc = plan.stage_dc[r][s]
                workers[group_name(s, r)] = {"dc": dc, "gpu": CPU if cal else plan.gpu_types[dc], "tp": plan.tp,
                                        "max_tokens": max_tokens[s]}
    kv_time = kv_transfer(plan, opts)
    per_tok = kv_bytes_per_token(inference_model(opts.model))
    kv = {}
    for a in plan.dcs_used():
        for b in plan.dcs_used():
            lat = kv_time(a, b, 0)
            kv[f"{a}|{b}"] = [lat, per_tok * 1e6 / max(kv_time(a, b, 1_000_000) - lat, 1e-12)]
    cfg = {"model": opts.model, "layers": inference_model(opts.model).layers, "workers": workers,
           "guard_s": opts.guard_ms / 1e3, "slo_s": opts.ttft_slo_ms / 1e3, "last_iteration": exp.iterations - 1,
           "kv": kv, "kv_bytes_per_token": per_tok, "prefill_model": opts.prefill_model,
           "gpus": {} if cal else {g: describe_gpu(g) for g in {w["gpu"] for w in workers.values()}},
           "calibration": [cal.overhead_per_layer_s, cal.flop_rate, cal.allreduce_rate, cal.large_pass_factor,
                           cal.attention_rate] if cal else None,
           "requests": [[q.request_id, q.arrival_s, q.prompt_tokens, q.output_tokens, homes[q.request_id]]
                        for q in reqs]}
    return cfg, reqs


def served_requests(plan: Plan, exp: Experiment, reqs: list[Request], homes: dict[int, str], results: dict,
                    starts: list[float], durations: list[float], real_compute: bool) -> tuple[list[tuple], dict]:
    """Requests.csv rows and serving metrics of the steady iterations (1..), on the timeline clock.

    Served in bubbles: every chunk of its final placement ran (after its last skip, if any). TTFT: the
    last chunk's end, or with real compute the KV cache's arrival at its decode process (end to end).
    Where KV caches were shipped (real compute; `ship_kv`: those whose home is another DC), `kv_ready` is that
    arrival, and the metrics
    add the KV bytes sent across the WAN (the model's size, not over k), the shipping time across the WAN
    (prefill end to arrival) and `kv_not_arrived`: caches of served requests that had not arrived when the
    run stopped (after the workers' bounded wait, testbed/bubbletea/worker_side.py KV_DRAIN_S).
    Otherwise the fallback pool (same size as the simulator's) serves it, queued from when the service
    sent it there (its arrival, or the re-plan or skip that gave up on the bubbles)."""
    opts = exp.bubbletea
    shift, horizon_end = durations[0], sum(durations)
    rec = ServiceRecord.of(results, starts, durations)
    last_skip, ran, decided, decoded = rec.last_skip, rec.ran, rec.decided, rec.decoded
    abs_to_timeline = rec.abs_to_timeline
    outcomes, rows, pool_queue, chunks_ran = [], [], [], []
    # KV caches that crossed the emulated WAN: real compute always, modeled compute with `ship_kv`
    shipped = real_compute or opts.ship_kv
    kv_per_token = kv_bytes_per_token(inference_model(opts.model))
    ship_s: list[float] = []
    kv_wan, not_arrived = 0.0, 0
    for q in reqs:
        arrival = q.arrival_s + shift
        if arrival >= horizon_end:
            break
        d = decided.get(q.request_id)
        mine = []
        if d is not None and d[1]:
            mine = [c for c in ran.get(q.request_id, []) if c[0] == d[1] and c[2] >= last_skip.get(q.request_id, -1)]
        if d is not None and d[1] and len({c[1] for c in mine}) == d[3]:
            end = max(c[3] for c in mine)
            kv_ready = ""
            dc = plan.stage_dc[int(d[1][1:].split("r")[1])][int(d[1][1:].split("r")[0])]
            # shipped: its KV cache crossed the emulated WAN (real compute: also the home DC's LAN)
            if shipped and (real_compute or dc != homes[q.request_id]):
                if q.request_id in decoded:
                    kv_ready = abs_to_timeline(decoded[q.request_id][2])
                    if dc != homes[q.request_id]:
                        ship_s.append(decoded[q.request_id][2] - max(c[6] for c in mine))
                        kv_wan += kv_per_token * q.prompt_tokens
                    if real_compute:
                        end = kv_ready
                else:
                    not_arrived += 1
            start = min(c[2] for c in mine)
            chunks_ran += [(dc, (c[2], c[3], c[4], c[5])) for c in mine]
            outcomes.append(Outcome(q.prompt_tokens, end - arrival, True))
            rows.append([q.request_id, arrival, q.prompt_tokens, d[1], dc, start, end, len(mine), 1,
                         homes[q.request_id], kv_ready, 0.0, ""])
        else:
            join = d[2] if d is not None and d[2] is not None else arrival
            join = max(join, arrival, last_skip.get(q.request_id, 0.0))
            reason = pool_reason(d is not None and bool(d[1]), str(d[4]) if d is not None and d[2] is not None
                                 else None)
            pool_queue.append((join, arrival, q, reason))
    pool = fallback_pool(plan, opts, exp.seed)
    for join, arrival, q, reason in sorted(pool_queue, key=lambda x: (x[0], x[1])):
        served = pool.serve(join, q.prompt_tokens, homes[q.request_id])
        outcomes.append(Outcome(q.prompt_tokens, served.end_s - arrival, False, served.start_s - arrival))
        rows.append([q.request_id, arrival, q.prompt_tokens, "fallback", served.dc, served.start_s, served.end_s,
                     0, 0, homes[q.request_id], "", served.start_s - arrival, reason])
    horizon = horizon_end - shift
    handed = sum(len(js) for k, per in results.get("jobs", {}).items() if int(k) < len(starts) for js in per.values())
    m = {**serving_metrics(outcomes, horizon, opts.ttft_slo_ms / 1e3), **pool_metrics(pool, horizon),
         "prefill_skipped": round(len(results.get("skipped", [])) / handed, 6) if handed else 0.0}
    if shipped:  # as the simulator's columns (testbed/bubbletea/run.py kv_wan_metrics), measured
        m.update(_kv_metrics(kv_wan, ship_s, not_arrived))
    if not real_compute:
        from testbed.bubbletea.run import train_mfu

        m.update(useful_work(plan, opts, chunks_ran, horizon, train_mfu(exp.workload.mfu, plan.tp, plan)))
    return sorted(rows, key=lambda r: r[0]), m


def _kv_metrics(kv_wan: float, ship_s: list[float], not_arrived: int) -> dict:
    """The shipped KV caches' columns, as the simulator's (testbed/bubbletea/run.py kv_wan_metrics), measured."""
    from testbed.bubbletea.run import _ms, _pct

    return {"kv_wan_bytes": int(kv_wan), "kv_ship_p50_ms": _ms(_pct(ship_s, 50)),
            "kv_ship_p99_ms": _ms(_pct(ship_s, 99)), "kv_not_arrived": not_arrived}


@dataclass
class ServiceRecord:
    """What the BubbleTea service recorded, on the run's timeline clock: iteration k's monotonic start `starts[k]`
    falls at the sum of the iterations before it (the barrier gaps removed)."""

    starts: list[float]
    tl_start: list[float]
    last_skip: dict[int, float]  # request -> its last skip
    ran: dict[int, list]  # request -> (worker, chunk, start, end, tokens, cached, monotonic end) per chunk run
    decided: dict[int, list]  # request -> the service's decision
    decoded: dict[int, list]  # request -> its KV cache's arrival at its decode process

    @classmethod
    def of(cls, results: dict, starts: list[float], durations: list[float]) -> ServiceRecord:
        rec = cls(starts, [sum(durations[:k]) for k in range(len(durations))], {}, {},
                  {int(d[0]): d for d in results.get("decisions", [])},
                  {int(d[0]): d for d in results.get("decoded", [])})
        for rid, _w, it, t in results.get("skipped", []):
            if it < len(starts):
                rec.last_skip[rid] = max(rec.last_skip.get(rid, 0.0), rec.on_timeline(it, t))
        for rid, w, it, chunk, a, b, tokens, cached in results.get("ran", []):
            if it < len(starts):
                rec.ran.setdefault(rid, []).append((w, chunk, rec.on_timeline(it, a), rec.on_timeline(it, b), tokens,
                                                    cached, b))
        return rec

    def on_timeline(self, it: int, t: float) -> float:
        return self.tl_start[it] + t - self.starts[it]

    def abs_to_timeline(self, t: float) -> float:
        """A monotonic time on the timeline clock, in the iteration that had started by then."""
        k = max((i for s, i in sorted(zip(self.starts, range(len(self.starts)), strict=True)) if s <= t), default=0)
        return self.on_timeline(k, t)


def served_same_requests(sim_rows: list[tuple], emu_rows: list[tuple]) -> tuple[float, float, int]:
    """The share of requests served in bubbles by each engine over the requests both were offered
    (requests.csv rows): each engine is offered the requests arriving during its own steady iterations, and
    the slower one's last requests arrive after the other's run ended, where no bubble of either serves them."""
    from testbed.bubbletea.run import REQUESTS_HEADER

    rid, served = REQUESTS_HEADER.index("request_id"), REQUESTS_HEADER.index("in_bubble")
    sim = {int(r[rid]): int(r[served]) for r in sim_rows}
    emu = {int(r[rid]): int(r[served]) for r in emu_rows}
    both = sim.keys() & emu.keys()
    if not both:
        return 0.0, 0.0, 0
    return sum(sim[q] for q in both) / len(both), sum(emu[q] for q in both) / len(both), len(both)


def slowdown(bt_durations: list[float], base_durations: list[float]) -> tuple[float, float, float]:
    """Training slowdown over the steady iterations: median(BubbleTea) / median(alone) - 1, and the
    25th and 75th percentiles of each BubbleTea iteration against the median alone (the spread)."""
    from testbed.bubbletea.without_prefill import summary

    base = median(base_durations)
    _, p25, p75 = summary([d / base - 1 for d in bt_durations])
    return median(bt_durations) / base - 1, p25, p75

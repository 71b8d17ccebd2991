"""BubbleTea in the simulator with timing noise: the emulated service's online planner
(testbed/bubbletea/online.py) against jittered iterations (testbed/sim/realised.py: `realise`).

Iteration 0 runs without prefill (as the emulated warm-up) and teaches the planner its first windows;
from iteration 1 on, requests arrive, the planner re-plans every iteration from the windows of the
iterations before it, and each iteration is run with the jobs occupying their groups: a job starts only
while its group is idle and never after its latest start (else it is skipped and its request re-planned),
and pauses at a layer boundary when training needs the group. `train_slowdown`: the median iteration with
prefill over the median of the same jittered iterations without it (the same noise per op and transfer).
Without noise (jitter 0) the simulator places prefill once, against the exact bubbles
(testbed/bubbletea/run.py), and `replay` realises that placement iteration by iteration.

In both, a request's last chunk ships its KV cache to the home DC as a flow on the WAN link
(testbed/sim/realised.py): it shares the link with training's transfers, so training can slow (fair
sharing) or the KV cache waits (lowest priority under Atlas's turns); flows unfinished at an iteration's
end go on in the next (`KvLedger`).
"""

from __future__ import annotations

from statistics import median

from testbed.bubbletea.online import OnlinePlanner, pool_reason
from testbed.bubbletea.scheduler import GroupCost, Placement
from testbed.bubbletea.trace import Request
from testbed.plan.plan import Plan
from testbed.sim.realised import Jitter, KvShipment, PrefillJob, Realisation, realise
from testbed.spec.experiment import BubbleTeaOptions
from testbed.timeline import Interval, Timeline, group_gaps, sort_intervals

TRAINING = ("fwd", "bwd", "allreduce")
INF = float("inf")


class KvLedger:
    """KV caches across a run's realised iterations: the flows one iteration leaves go on in the next, and
    when each cache reached its home DC, on the run's clock (key: the job's (request id, chunk))."""

    def __init__(self) -> None:
        self.carry: list[KvShipment] = []
        self.ready: dict[tuple, float] = {}

    def realise(self, plan: Plan, jitter: Jitter | None, jobs: dict[str, list[PrefillJob]], t0: float,
                last: bool) -> Realisation:
        """The iteration starting at t0 (run clock), with the flows the one before left on the links."""
        sim = realise(plan, jitter, jobs, self.carry, carry_kv=not last)
        for d in sim.kv_done:
            self.ready[d.key] = t0 + d.ready_s
        self.carry = sim.kv_left
        return sim


def windows_of(sim) -> dict[str, list[tuple[int, float, float]]]:
    """Each group's idle windows in a realised iteration: the gaps between its training ops, the last one
    running to the end of the last training op anywhere (offsets from the iteration's start), each with its
    index (the training ops before it), as the emulated workers report them."""
    busy: dict[str, list[tuple[float, float]]] = {}
    end = 0.0
    for iv in sim.timeline.rep_intervals():
        if iv.kind in TRAINING:
            busy.setdefault(iv.gpu, []).append((iv.start_s, iv.end_s))
            end = max(end, iv.end_s)
    out = {}
    for g, ivs in busy.items():
        ws, cur = [], 0.0
        ivs.sort()
        for n, (a, b) in enumerate(ivs):
            if a > cur + 1e-9:
                ws.append((n, cur, a))
            cur = max(cur, b)
        if end > cur + 1e-9:
            ws.append((len(ivs), cur, end))
        out[g] = ws
    return out


def realised_run(plan: Plan, reqs: list[Request], homes: dict[int, str], costs: dict[tuple[str, str], GroupCost],
                 kv_time, opts: BubbleTeaOptions, seed: int, iterations: int, layers: int, kv_per_token: float):
    """(timeline of the steady iterations, placements (served or fallback, on that clock), pool join times
    of requests the bubbles gave up, iteration times, the same without prefill, [(dc, chunk)] that ran)."""
    workers = {w: (dc, c) for (w, dc), c in costs.items()}
    planner = OnlinePlanner(list(reqs), workers, homes=homes, kv_time=kv_time, guard_s=opts.guard_ms / 1e3,
                            slo_s=opts.ttft_slo_ms / 1e3, last_iteration=iterations)
    ivs: list[Interval] = []
    durations, base, done, starts = [], [], {}, []
    ledger = KvLedger()
    t = 0.0
    for k in range(iterations + 1):  # iteration 0: the warm-up, left out like the emulated run's
        jit = Jitter(seed * 1009 + k, opts.jitter_compute_cv, opts.jitter_wan_cv)
        jobs = {} if k == 0 else planner.plan(k, t)
        pjobs = {w: [PrefillJob(min(j.earliest_s, j.offset_s), j.duration_s, j.latest_s, layers,
                                (j.request_id, j.chunk),
                                (j.home_dc, kv_per_token * (j.cached + j.tokens)) if j.chunk == j.chunks - 1 else None)
                     for j in js] for w, js in jobs.items()}
        sim = ledger.realise(plan, jit, pjobs, t, k == iterations)
        d = sim.timeline.iteration_s[0]
        if k == 0:
            planner.observe(windows_of(sim), d, warmup=True)
            planner.shift(d)
            t += d
            continue
        starts.append(t)
        durations.append(d)
        base.append(realise(plan, jit).timeline.iteration_s[0])
        planner.overran(max(0.0, d - base[-1]), d)  # what training waited for prefill, as the workers report it
        for iv in sim.timeline.rep_intervals():
            if iv.kind != "idle":
                ivs.append(iv._replace(iteration=k - 1, start_s=iv.start_s + t - starts[0],
                                       end_s=iv.end_s + t - starts[0]))
        planned = {(j.request_id, j.chunk): j.duration_s for js in jobs.values() for j in js}
        for key, _g, a, b in sim.prefill_done:
            done[key] = (a + t, b + t)
            planner.took(planned[key], b - a)
        for key, _g, when in sim.prefill_skipped:
            planner.skipped(key[0], when + t)
            for old in [c for c in done if c[0] == key[0]]:  # a re-planned request starts over
                del done[old]
        planner.observe(windows_of(sim), d)
        t += d
    t0, horizon_end = starts[0], t
    real, joins, chunks = [], {}, []
    for q in planner.requests:
        if q.arrival_s >= horizon_end:
            break
        moved = Request(q.request_id, q.arrival_s - t0, q.prompt_tokens, q.output_tokens)
        dec = planner.decided.get(q.request_id)
        pl = Placement(moved, homes[q.request_id])
        keys = [(q.request_id, j.chunk) for j in dec.jobs] if dec is not None and dec.worker else []
        if keys and all(k in done for k in keys):
            iv = [(done[k][0] - t0, done[k][1] - t0, j.tokens) for k, j in zip(keys, dec.jobs, strict=True)]
            dc = workers[dec.worker][0]
            chunks += [(dc, (a, b, tok, j.cached)) for (a, b, tok), j in zip(iv, dec.jobs, strict=True)]
            pl.gpu, pl.dc, pl.intervals, pl.fallback, pl.end_s = dec.worker, dc, iv, False, iv[-1][1]
            pl.kv_ready_s = ledger.ready[keys[-1]] - t0
        else:  # given up (at the re-plan or skip that did), deferred past the run's end, or never placed
            join = dec.pool_join_s if dec is not None and dec.pool_join_s is not None else q.arrival_s
            joins[q.request_id] = max(join, q.arrival_s) - t0
            pl.pool_reason = pool_reason(bool(keys), dec.reason if dec is not None and dec.pool_join_s is not None
                                         else None)
        real.append(pl)
    timeline = Timeline(plan.run_id, "sim", sort_intervals(ivs + group_gaps(ivs, durations)), durations,
                        plan.pp * plan.dp)
    return timeline, real, joins, durations, base, chunks


def iteration_of(t: float, iteration_s: float, iterations: int) -> int:
    """The iteration a planned start on the run's clock falls in. A start planned at an iteration's very
    beginning (k T, summed in floating point) can read a hair below it; it belongs to iteration k, not at the
    end of k - 1 (where it would run after training's last op and stretch that iteration by its length)."""
    return min(int(t / iteration_s + 1e-9), iterations - 1)


def replay(plan: Plan, placements: list[Placement], iteration_s: float, iterations: int, layers: int,
           kv_per_token: float) -> tuple[Timeline, list[float], float]:
    """The static placement (no noise) realised iteration by iteration: each bubble-served chunk a job from
    its planned start (it never gives up: `latest_s` unbounded), the last chunk shipping its KV cache. Updates
    the placements' intervals, ends and `kv_ready_s` to what was realised (chunks start at most as planned,
    on the clock of iterations that may have run longer); returns the timeline, the iteration times, and
    the iteration time without prefill (the same realisation, nothing added)."""
    T = iteration_s
    per_it: list[dict[str, list[PrefillJob]]] = [{} for _ in range(iterations)]
    for pl in placements:
        if pl.fallback:
            continue
        n = len(pl.intervals)
        for c, (a, b, _tok) in enumerate(pl.intervals):
            k = iteration_of(a, T, iterations)
            kv = (pl.home_dc, kv_per_token * pl.request.prompt_tokens) if c == n - 1 else None
            per_it[k].setdefault(pl.gpu, []).append(PrefillJob(max(0.0, a - k * T), b - a, INF, layers,
                                                              (pl.request.request_id, c), kv))
    base = realise(plan, None, {"": []}).timeline.iteration_s[0]  # every replica simulated, as with prefill
    ledger = KvLedger()
    ivs: list[Interval] = []
    durations, done, t = [], {}, 0.0
    for k, jobs in enumerate(per_it):
        sim = ledger.realise(plan, None, jobs, t, k == iterations - 1)
        for iv in sim.timeline.rep_intervals():
            if iv.kind != "idle":
                ivs.append(iv._replace(iteration=k, start_s=iv.start_s + t, end_s=iv.end_s + t))
        for key, _g, a, b in sim.prefill_done:
            done[key] = (a + t, b + t)
        durations.append(sim.timeline.iteration_s[0])
        t += durations[-1]
    for pl in placements:
        if pl.fallback:
            continue
        rid = pl.request.request_id
        pl.intervals = [(*done[(rid, c)], tok) for c, (_a, _b, tok) in enumerate(pl.intervals)]
        pl.end_s = pl.intervals[-1][1]
        pl.kv_ready_s = ledger.ready[(rid, len(pl.intervals) - 1)]
    timeline = Timeline(plan.run_id, "sim", sort_intervals(ivs + group_gaps(ivs, durations)), durations,
                        plan.pp * plan.dp)
    return timeline, durations, base


def slowdown(durations: list[float], base: list[float]) -> float:
    return median(durations) / median(base) - 1

"""A sync period (DiLoCo, Streaming DiLoCo: testbed/plan/diloco.py) simulated in proportion to its distinct inner
steps, not to H.

Between two syncs a DC's inner steps use nothing another DC or the WAN uses, and each drains the pipeline and
ends in the DC's all-reduce and optimizer step, so once one inner step is the one before it shifted in time, every
inner step up to the next sync is too. Past the full simulation's size (testbed/sim/aggregate.py) the period is
simulated with each of its F segments (H / F inner steps, the last tau of them overlapping the fragment's sync)
cut to tau + 3 inner steps: the first (it may start behind the last sync's wait), two that check the shift, then
the tau the sync overlaps. If in every segment the third inner step is the second shifted by one Delta for every
group, the other H / F - tau - 3 inner steps are that step repeated, Delta apart, and everything after them moves by
their time (`PeriodTimeline`); if not, or if a DC joined a fragment's sync while another DC was still in the one before
(their rings would share the WAN, `_syncs_apart`), the whole period is simulated.
"""

from __future__ import annotations

import math
from dataclasses import replace

from testbed.plan.plan import Plan
from testbed.sim.aggregate import FULL_STAGE_MICROBATCHES, stage_microbatches
from testbed.sim.executor import replica_classes
from testbed.sim.executor import simulate as simulate_full
from testbed.timeline import BUSY, Timeline, idle_gaps

PER_STEP = ("allreduce", "optimizer")  # one per group and inner step, mb -1: counted in order


def kept_steps(plan: Plan) -> int:
    """Inner steps per segment the compressed period keeps: the first, two to check the shift, the overlapped."""
    return plan.diloco.overlap_steps + 3


def compresses(plan: Plan, force: bool = False) -> bool:
    """Whether the period is simulated compressed: a sync period past the full simulation's size (or `force`)
    whose segments are longer than the steps kept."""
    d = plan.diloco
    if d is None or plan.virtual_stages > 1 or d.inner_steps // d.fragments <= kept_steps(plan):
        return False
    return force or stage_microbatches(plan, len(replica_classes(plan))) > FULL_STAGE_MICROBATCHES


def simulate(plan: Plan, compress: bool | None = None) -> tuple[Timeline, int]:
    """One iteration (a sync period compressed where `compresses`; `compress` forces it on or off); as
    testbed/sim/executor.py simulate."""
    if compress is False or not compresses(plan, bool(compress)):
        return simulate_full(plan)
    d = plan.diloco
    k = kept_steps(plan)
    short = replace(plan, diloco=replace(d, inner_steps=d.fragments * k))
    tl, events = simulate_full(short)
    _, reps, raw = tl._raw
    deltas = _shifts(short, raw)
    if deltas is None or not _syncs_apart(raw):  # not a shift, or syncs sharing the WAN: the whole period
        return simulate_full(plan)
    return PeriodTimeline(plan, reps, raw, tl.copies, deltas, tl.iteration_s[0]), events


def _step_of(plan: Plan, raw: list[tuple]) -> list[int]:
    """Each raw tuple's inner step in the compressed period (an outer sync's: the step it starts after)."""
    m, d = plan.microbatches, plan.diloco
    seen: dict[tuple, int] = {}
    out = []
    for g, kind, mb, *_ in raw:
        if kind in PER_STEP:
            h = seen.get((g, kind), 0)
            seen[(g, kind)] = h + 1
        elif kind == "outersync":
            h = d.sync_after(mb)
        else:
            h = mb // m
        out.append(h)
    return out


def _syncs_apart(raw: list[tuple]) -> bool:
    """Whether every fragment's sync has ended in every DC before any DC joins the next one's. A DC goes on as its
    own part ends (sim/sync.py), so a fast DC may join fragment f + 1 while fragment f's ring still runs in the
    others; the repeated inner steps would then move the two rings apart on the links they share."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for _g, kind, f, t0, t1, _b in raw:
        if kind == "outersync":
            first[f] = min(first.get(f, t0), t0)
            last[f] = max(last.get(f, t1), t1)
    return all(last[f] <= first[f + 1] for f in last if f + 1 in first)


def _shifts(short: Plan, raw: list[tuple]) -> list[float] | None:
    """Per segment, Delta: inner step 2 of the segment is step 1 shifted by Delta, interval by interval for every
    group; None where it is not."""
    k, m = kept_steps(short), short.microbatches
    steps = _step_of(short, raw)
    T = max((x[4] for x in raw), default=0.0)
    tol = 1e-9 * max(1.0, T)
    out = []
    for f in range(short.diloco.fragments):
        a, b = f * k + 1, f * k + 2
        one: dict[int, list] = {}
        two: dict[int, list] = {}
        for x, h in zip(raw, steps, strict=True):
            if x[1] != "outersync" and h in (a, b):
                mb = x[2] - (h - a) * m if x[2] >= 0 else -1
                (one if h == a else two).setdefault(x[0], []).append((x[1], mb, x[3], x[4], x[5]))
        if one.keys() != two.keys() or not one:
            return None
        delta = None
        for g, xs in one.items():
            ys = two[g]
            if len(xs) != len(ys):
                return None
            for (k1, m1, s1, e1, b1), (k2, m2, s2, e2, b2) in zip(sorted(xs), sorted(ys), strict=True):
                if (k1, m1, b1) != (k2, m2, b2):
                    return None
                delta = s2 - s1 if delta is None else delta
                if abs(s2 - s1 - delta) > tol or abs(e2 - e1 - delta) > tol:
                    return None
        out.append(delta or 0.0)
    return out


class PeriodTimeline(Timeline):
    """A sync period's timeline from its compressed simulation: `raw` holds the kept inner steps; in segment f,
    step f k + 1 stands for n = H / F - k + 1 inner steps Delta_f apart, and everything after it in the segment and
    in later segments moves by n - 1 of them. Metrics come from the kept steps and the repeated one's sums;
    intervals are built, for the replicas asked for only, as the whole period would give them."""

    def __init__(self, plan: Plan, reps: list[int], raw: list[tuple], copies, deltas: list[float],
                 short_s: float) -> None:
        d = plan.diloco
        self.k, self.extra = kept_steps(plan), d.inner_steps // d.fragments - kept_steps(plan)
        self.deltas = deltas
        super().__init__(plan.run_id, "sim", None, [short_s + self.extra * math.fsum(deltas)], plan.pp * plan.dp,
                         copies, (plan, reps, raw))
        short = replace(plan, diloco=replace(d, inner_steps=d.fragments * self.k))
        self.steps = _step_of(short, raw)

    def _moved(self, h: int, t: float) -> float:
        """Time t of compressed step h in the whole period: after the repeats of every segment it follows."""
        f, j = divmod(h, self.k)
        return t + self.extra * (math.fsum(self.deltas[:f]) + (self.deltas[f] if j >= 2 else 0.0))

    def expanded(self, keep_groups: set[int] | None) -> list[tuple]:
        """The whole period's raw tuples of the groups kept (None: all)."""
        plan, _, raw = self._raw
        m, per = plan.microbatches, plan.diloco.inner_steps // plan.diloco.fragments
        out = []
        for (g, kind, mb, t0, t1, nbytes), h in zip(raw, self.steps, strict=True):
            if keep_groups is not None and g not in keep_groups:
                continue
            f, j = divmod(h, self.k)
            full = f * per + (j if j < 2 else j + self.extra)
            mb_full = mb + (full - h) * m if mb >= 0 and kind != "outersync" else mb
            out.append((g, kind, mb_full, self._moved(h, t0), self._moved(h, t1), nbytes))
            if j == 1 and kind != "outersync":
                for n in range(1, self.extra + 1):
                    dt = self.deltas[f] * n
                    out.append((g, kind, mb_full + n * m if mb >= 0 else mb, self._moved(h, t0) + dt,
                                self._moved(h, t1) + dt, nbytes))
        return out

    def _built(self, replicas: set[int] | None):
        plan, reps, raw = self._raw
        keep = None if replicas is None else {k * plan.pp + s for k, r in enumerate(reps) if r in replicas
                                              for s in range(plan.pp)}
        saved = self._raw
        self._raw = (plan, reps, self.expanded(keep))
        try:
            return super()._built(replicas)
        finally:
            self._raw = saved

    def busy_time(self, kinds: tuple[str, ...]) -> float:
        """As Timeline's; kinds other than busy ones or idle alone from the whole period's intervals."""
        if self._raw is not None and kinds != ("idle",) and not all(k in BUSY for k in kinds):
            self.rep_intervals()
        return super().busy_time(kinds)

    def _raw_times(self) -> tuple[dict[str, list[float]], float]:
        """Busy seconds per kind and idle seconds of the whole period: the kept steps' plus the repeats' (each
        group's idle time in a repeat is Delta less what its busy intervals cover)."""
        if self._times is None:
            plan, reps, raw = self._raw
            w = [self.weight(r) for r in reps for _ in range(plan.pp)]
            per_kind: dict[str, list[float]] = {k: [] for k in BUSY}
            busy: dict[int, list[tuple[float, float]]] = {g: [] for g in range(len(w))}
            rep_busy: dict[tuple[int, int], list[tuple[float, float]]] = {}
            for (g, kind, _mb, t0, t1, _b), h in zip(raw, self.steps, strict=True):
                if kind not in BUSY:
                    continue
                f, j = divmod(h, self.k)
                n = 1 + (self.extra if j == 1 and kind != "outersync" else 0)
                per_kind[kind].append((t1 - t0) * w[g] * n)
                busy[g].append((self._moved(h, t0), self._moved(h, t1)))
                if n > 1:
                    rep_busy.setdefault((g, f), []).append((t0, t1))
            T = self.iteration_s[0]
            idle = [sum(b - a for a, b in idle_gaps(busy[g], 0.0, T)) * w[g] for g in range(len(w))]
            for (g, f), ivs in rep_busy.items():  # the repeats, shifted out of the kept timeline's gaps above
                t0 = min(a for a, _ in ivs)
                covered = self.deltas[f] - sum(b - a for a, b in idle_gaps(ivs, t0, t0 + self.deltas[f]))
                idle[g] -= self.extra * self.deltas[f] * w[g]  # the gap the shift opened in `busy`
                idle[g] += self.extra * (self.deltas[f] - covered) * w[g]
            self._times = (per_kind, math.fsum(idle))
        return self._times

"""Invariants every timeline must satisfy, simulated or emulated. Returns violations, not booleans,
so a failing test says what broke."""

from __future__ import annotations

from collections import defaultdict

from testbed.plan.plan import Plan
from testbed.timeline import Timeline

EXCLUSIVE = ("fwd", "bwd", "prefill", "fill")  # a GPU group runs at most one of these at a time


def check_timeline(tl: Timeline, plan: Plan, tol: float = 1e-9) -> list[str]:
    bad: list[str] = []
    by_group: dict[tuple[int, int, int], list] = defaultdict(list)
    compute: dict[tuple[int, int, int, str, int], tuple[float, float]] = {}
    sends: dict[tuple, list] = defaultdict(list)
    recvs: dict[tuple, list] = defaultdict(list)
    for iv in tl.intervals:
        if iv.end_s < iv.start_s - tol:
            bad.append(f"{iv.gpu} {iv.kind} mb{iv.microbatch}: ends before it starts")
        key = (iv.iteration, iv.replica, iv.stage)
        if iv.kind in EXCLUSIVE:
            by_group[key].append(iv)
        if iv.kind in ("fwd", "bwd"):  # a split backward's first interval (zero-bubble's B; W follows it)
            compute.setdefault((*key, iv.kind, iv.microbatch), (iv.start_s, iv.end_s))
        elif iv.kind == "send":
            sends[(iv.iteration, iv.replica, iv.microbatch)].append(iv)
        elif iv.kind == "recv":
            recvs[(iv.iteration, iv.replica, iv.microbatch)].append(iv)

    for key, ivs in by_group.items():
        ivs.sort(key=lambda iv: iv.start_s)
        for a, b in zip(ivs, ivs[1:], strict=False):
            if b.start_s < a.end_s - tol:
                bad.append(f"{a.gpu} it{key[0]}: {a.kind} mb{a.microbatch} overlaps {b.kind} mb{b.microbatch}")

    P = plan.pp
    V = plan.virtual_stages  # with several chunks a stage runs each microbatch V times: the timeline names no
    # chunk, so the order across stages is the dry run's and the simulator's to check (plan/lower.py dry_run)
    for (it, r, s, kind, i), (t0, _t1) in compute.items() if V == 1 else ():
        if kind == "fwd" and s > 0:
            up = compute.get((it, r, s - 1, "fwd", i))
            if up is None or t0 < up[1] - tol:
                bad.append(f"s{s}r{r} it{it}: fwd mb{i} starts before stage {s - 1} finished it")
        if kind == "bwd":
            own = compute.get((it, r, s, "fwd", i))
            if own is None or t0 < own[1] - tol:
                bad.append(f"s{s}r{r} it{it}: bwd mb{i} starts before its own fwd")
            if s < P - 1:
                down = compute.get((it, r, s + 1, "bwd", i))
                if down is None or t0 < down[1] - tol:
                    bad.append(f"s{s}r{r} it{it}: bwd mb{i} starts before stage {s + 1}'s bwd")

    sent = recvd = 0.0
    for key in set(sends) | set(recvs):
        ss, rr = sorted(sends.get(key, []), key=lambda iv: iv.start_s), sorted(
            recvs.get(key, []), key=lambda iv: iv.start_s)
        if len(ss) != len(rr):
            bad.append(f"replica {key[1]} mb{key[2]} it{key[0]}: {len(ss)} sends but {len(rr)} recvs")
            continue
        for a, b in zip(ss, rr, strict=True):
            if b.end_s < a.end_s - tol:
                bad.append(f"{b.gpu} mb{b.microbatch}: recv ends before its send")
        sent += sum(iv.bytes for iv in ss)
        recvd += sum(iv.bytes for iv in rr)
    # every chunk boundary inside a stage's neighbours, and V - 1 wraps from the last stage to the first
    per_mb = V * sum(plan.act_bytes[:-1]) + (V - 1) * plan.act_bytes[-1]
    expected = 2 * sum(plan.microbatches_of(r) for r in range(plan.dp)) * per_mb * len(tl.iteration_s)
    if abs(sent - recvd) > 1e-6 * max(sent, 1):
        bad.append(f"bytes not conserved: sent {sent:.0f}, received {recvd:.0f}")
    if abs(sent - expected) > 1e-6 * max(expected, 1):
        bad.append(f"bytes sent {sent:.0f} differ from the plan's {expected:.0f}")
    return bad

"""How much slower than its shaped rate the emulated DC fabric carried a run's transfers inside a DC: a timing
disturbance that late sleeps, the delay line's lag and steal do not show. Every host's NIC is shaped to its group's
fabric rate (the plan's `IntraDC`, divided by k), so a message on an idle pipe, or a ring all-reduce once all its
members have joined, takes its bytes at that rate plus the fabric's latency; what it takes beyond that is the
machine failing to move packets (veth, bridge and HTB run in softirq on the same CPUs as everything else): a ring
all-reduce of three groups at 800 Mbit/s each ran at half that rate at load 20 on the 2-core VM, and the run's
other timing health was quiet (docs/fidelity.md, "The wide draw").

Both measures use only the plan's fabric rate and the emulated timeline, never the simulator's times."""

from __future__ import annotations

from collections import defaultdict

from testbed.timeline import Interval


def ring_s(nbytes: float, members: int, bandwidth_bytes_s: float, latency_s: float) -> float:
    """A flat ring all-reduce of `nbytes` per member: 2 (n - 1) steps of nbytes / n, each a latency."""
    n = members
    return 2 * (n - 1) / n * nbytes / bandwidth_bytes_s + 2 * (n - 1) * latency_s if n > 1 else 0.0


def lan_transfer_excess_s(intervals: list[Interval], bandwidth_bytes_s: dict[str, float],
                          latency_s: dict[str, float]) -> float:
    """Mean time beyond bytes / rate + latency that messages inside a DC took, over those that met no other
    message into the same group (so no FIFO ahead of them) and whose sender is certainly in the receiver's DC
    (every neighbouring stage of the receiver runs there). 0 when none qualifies or they came early."""
    dc_of = {(iv.iteration, iv.stage, iv.replica): iv.dc for iv in intervals}
    recvs: dict[tuple[int, str], list[Interval]] = defaultdict(list)
    for iv in intervals:
        if iv.kind == "recv" and iv.bytes > 0:
            recvs[(iv.iteration, iv.gpu)].append(iv)
    excess = []
    for rs in recvs.values():
        rs.sort(key=lambda iv: iv.start_s)
        for k, iv in enumerate(rs):
            near = [dc_of.get((iv.iteration, iv.stage + d, iv.replica)) for d in (-1, 1)]
            if any(d is not None and d != iv.dc for d in near) or all(d is None for d in near):
                continue
            if any(o.start_s < iv.end_s and o.end_s > iv.start_s for j, o in enumerate(rs) if j != k):
                continue
            alone = iv.bytes / bandwidth_bytes_s[iv.dc] + latency_s[iv.dc]
            excess.append(iv.end_s - iv.start_s - alone)
    return max(0.0, sum(excess) / len(excess)) if excess else 0.0


BUCKETED = ("reduce_scatter", "all_gather")  # Megatron-Core's bucketed collectives (runtime/worker.py Buckets)


def allreduce_excess_s(intervals: list[Interval], grad_bytes: list[float], bandwidth_bytes_s: dict[str, float],
                       latency_s: dict[str, float]) -> float:
    """The most any stage's all-reduce inside one DC took beyond its ring's time, from its last member's start
    (each member's interval begins when it joins, so waiting for the others is left out) to its last member's end.
    A sync period (DiLoCo) holds H of them per group: the k-th of every member is one all-reduce. A stage whose
    collectives are bucketed has no all-reduce: its `allreduce` intervals are the time they were exposed."""
    bucketed = {(iv.iteration, iv.stage) for iv in intervals if iv.kind in BUCKETED}
    mine: dict[tuple[int, str], list[Interval]] = defaultdict(list)
    for iv in intervals:
        if iv.kind == "allreduce" and (iv.iteration, iv.stage) not in bucketed:
            mine[(iv.iteration, iv.gpu)].append(iv)
    by: dict[tuple[int, int, int], list[Interval]] = defaultdict(list)
    for ivs in mine.values():
        for k, iv in enumerate(sorted(ivs, key=lambda x: x.start_s)):
            by[(iv.iteration, iv.stage, k)].append(iv)
    worst = 0.0
    for (_it, s, _k), ivs in by.items():
        dcs = {iv.dc for iv in ivs}
        if len(dcs) != 1 or len(ivs) < 2:
            continue  # across DCs (the WAN's part is the delay line's) or a ring of one
        dc = dcs.pop()
        took = max(iv.end_s for iv in ivs) - max(iv.start_s for iv in ivs)
        worst = max(worst, took - ring_s(grad_bytes[s], len(ivs), bandwidth_bytes_s[dc], latency_s[dc]))
    return worst


def bucketed_excess_s(intervals: list[Interval], bandwidth_bytes_s: dict[str, float],
                      latency_s: dict[str, float]) -> float:
    """What a stage's bucketed collectives inside one DC took beyond their rings' time in one iteration, summed over
    its buckets (they run one at a time on the stage's stream), the most of any stage and iteration. Each is half
    a ring, (n - 1) steps of bytes / n, timed from its last member's start to its last member's end; a
    reduce-scatter whose members span DCs (hierarchical: the WAN's part is the delay line's) is left out, an
    all-gather is each DC's own."""
    by: dict[tuple, list[Interval]] = defaultdict(list)
    for iv in intervals:
        if iv.kind in BUCKETED:
            by[(iv.iteration, iv.stage, iv.kind, iv.microbatch, iv.dc if iv.kind == "all_gather" else "")].append(iv)
    per_stage: dict[tuple[int, int], float] = defaultdict(float)
    for (it, s, *_), ivs in by.items():
        dcs = {iv.dc for iv in ivs}
        n = len(ivs)
        if len(dcs) != 1 or n < 2:
            continue
        dc = dcs.pop()
        half = (n - 1) / n * ivs[0].bytes / bandwidth_bytes_s[dc] + (n - 1) * latency_s[dc]
        took = max(iv.end_s for iv in ivs) - max(iv.start_s for iv in ivs)
        per_stage[(it, s)] += max(0.0, took - half)
    return max(per_stage.values(), default=0.0)

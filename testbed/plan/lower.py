"""Plan -> programs: one typed step list per GPU group (testbed/program.py), executed alike by the
simulator and by emulated workers. Every decision an engine needs is made here once: each group's
host and port, the peer and bytes of each transfer, the connections of each pipe and the flow class
the Atlas sidecar shapes, and the all-reduce's algorithm and exchanges.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from testbed.plan.buckets import (
    all_gathers,
    backward_segments,
    forward_segments,
    gather_waits,
    reduce_scatters,
    scatter_waits,
    split,
)
from testbed.plan.plan import Plan
from testbed.program import (
    AllGather,
    AllReduce,
    Await,
    Backward,
    BackwardWeight,
    Forward,
    Pipe,
    Program,
    Recv,
    ReduceScatter,
    Send,
    Step,
)
from testbed.timeline import group_name

BASE_PORT = 7000  # group (stage s, replica r) listens on BASE_PORT + r * pp + s


def port(plan: Plan, stage: int, replica: int) -> int:
    return BASE_PORT + replica * plan.pp + stage


def pipe(plan: Plan, s: int, r: int, peer_stage: int) -> Pipe:
    """The pipe from stage s to peer_stage (a neighbour) of replica r: connections s opens to the peer's port and
    sends on, one way, as NCCL's send connections are (the peer's messages come back on its own pipe). On shared
    connections each direction's acknowledgements rode on the other's data, queued behind its window in the
    link's FIFO (docs/fidelity.md, "Acknowledgements behind data")."""
    a, b = plan.stage_dc[r][s], plan.stage_dc[r][peer_stage]
    wan = (a, b) if a != b else None
    conns = plan.links[(a, b)].connections if wan else 1
    window = plan.links[(a, b)].window_bytes if wan else 0.0
    return Pipe(group_name(peer_stage, r), conns, wan, port(plan, peer_stage, r), r if wan else None, window)


def allreduce(plan: Plan, s: int) -> AllReduce:
    """Stage s's gradient all-reduce: a ring when its replicas share a DC, else hierarchical (a ring
    inside each DC and one across DCs, in topology order)."""
    by_dc: dict[str, list[str]] = defaultdict(list)
    for q in range(plan.dp):
        by_dc[plan.stage_dc[q][s]].append(group_name(s, q))
    dcs = [d for d in plan.gpu_types if d in by_dc]
    rings = tuple(tuple(by_dc[d]) for d in dcs)
    if len(dcs) == 1 or plan.ideal_wan:
        return AllReduce("ring", plan.grad_bytes[s], rings)
    conns, windows = [], []
    for k, d in enumerate(dcs):  # every GPU of a DC's shard has its own NCCL connection; multi-TCP may add more
        n = len(rings[k]) * plan.tp * plan.nccl_sockets
        lp = plan.links[(d, dcs[(k + 1) % len(dcs)])]
        conns.append(max(n, lp.connections) if plan.mech.multi_tcp else n)
        windows.append(lp.window_bytes)
    return AllReduce("hierarchical", plan.grad_bytes[s], rings, tuple(conns), tuple(windows))


def host_index(plan: Plan, s: int, r: int) -> int:
    """Which of its DC's emulated hosts group (s, r) runs on: the DC's groups in (replica, stage) order take
    the hosts in turn, so no two groups share a host's NIC (which the simulator gives each group whole)
    while the DC has a host for each."""
    dc = plan.stage_dc[r][s]
    k = sum(1 for q in range(r) for d in plan.stage_dc[q] if d == dc) + plan.stage_dc[r][:s].count(dc)
    return k % plan.hosts.get(dc, 1)


def _compute_s(plan: Plan, r: int, s: int, op: str, c: int) -> float:
    """One microbatch's forward or backward through chunk c of group (s, r) (the whole stage with one chunk); with
    the zero-bubble schedule B is the backward less its weight gradient, W that weight gradient."""
    if plan.wgrad_s:
        if op == "W":
            return plan.wgrad_s[r][s]
        if op == "B":
            return plan.bwd_s[r][s] - plan.wgrad_s[r][s]
    if plan.virtual_stages > 1:
        return (plan.chunk_fwd_s if op == "F" else plan.chunk_bwd_s)[r][s][c]
    return (plan.fwd_s if op == "F" else plan.bwd_s)[r][s]


def action_steps(plan: Plan, s: int, r: int, op: str, i: int, c: int) -> list[Step]:
    """One schedule action of group (s, r) with its messages. Model piece q = c pp + s (chunk c of stage s) takes
    its activation from piece q - 1 and its gradient from piece q + 1: with virtual stages the last stage's chunk
    c sends to the first stage's chunk c + 1. A message carries the chunk of the group that consumes it."""
    if op == "W":  # the zero-bubble schedule's weight gradient: no message
        return [BackwardWeight(i, _compute_s(plan, r, s, op, c), c)]
    P = plan.pp
    q, last_q = c * P + s, plan.virtual_stages * P - 1
    prev, nxt = group_name((s - 1) % P, r), group_name((s + 1) % P, r)
    to_prev_bytes, to_next_bytes = plan.act_bytes[(s - 1) % P], plan.act_bytes[s]
    out: list[Step] = []
    if op == "F":
        if q > 0:
            out.append(Recv("a", i, prev, to_prev_bytes, c))
        out.append(Forward(i, _compute_s(plan, r, s, op, c), c))
        if q < last_q:
            out.append(Send("a", i, nxt, to_next_bytes, c if s < P - 1 else c + 1))
    else:
        if q < last_q:
            out.append(Recv("g", i, nxt, to_next_bytes, c))
        out.append(Backward(i, _compute_s(plan, r, s, op, c), c))
        if q > 0:
            out.append(Send("g", i, prev, to_prev_bytes, c if s > 0 else c - 1))
    return out


def peers(plan: Plan, s: int) -> list[int]:
    """The stages group s exchanges pipeline messages with: its neighbours, and with virtual stages the
    wrap-around between the last stage and the first (one pipe per peer, as with two stages both are one)."""
    P = plan.pp
    if plan.virtual_stages > 1:
        return list(dict.fromkeys([(s - 1) % P, (s + 1) % P]))
    return [q for q in (s - 1, s + 1) if 0 <= q < P]


def pipeline_steps(plan: Plan, s: int, r: int, base: int = 0) -> list[Step]:
    """Group (s, r)'s part of the pipeline schedule, its microbatches numbered from `base`."""
    steps: list[Step] = []
    for a in plan.actions_of(r)[s]:
        steps += action_steps(plan, s, r, a.op, a.microbatch + base, a.chunk)
    return steps


def lower_group(plan: Plan, s: int, r: int, reduce: AllReduce | None = None) -> Program:
    name = group_name(s, r)
    if plan.diloco is not None:  # one sync period (testbed/plan/diloco.py)
        from testbed.plan.diloco import period_steps

        m = plan.microbatches
        steps = period_steps(plan, s, r, lambda h: pipeline_steps(plan, s, r, h * m), reduce or allreduce(plan, s))
    else:
        steps = pipeline_steps(plan, s, r)
        if plan.dp > 1:
            ar = reduce or allreduce(plan, s)
            steps = overlapped(plan, s, r, steps, ar) if plan.mech.overlap else [*steps, ar]
    pipes = tuple(pipe(plan, s, r, q) for q in peers(plan, s))
    dc = plan.stage_dc[r][s]
    return Program(name, s, r, dc, host_index(plan, s, r), port(plan, s, r), plan.replica_offset_s[r],
                   tuple(steps), pipes)


def overlapped(plan: Plan, s: int, r: int, steps: list[Step], ar: AllReduce) -> list[Step]:
    """The `overlap` mechanism (plan/buckets.py): the parameter all-gathers first, the first forward waiting for
    each bucket only when its layers start, the last backward's reduce-scatters issued as it produces each
    bucket, and the program's end waiting for them all."""
    sizes = split(ar.bytes, plan.bucket_bytes)
    edges = plan.edge_grad_bytes[s] if plan.edge_grad_bytes else (0.0, 0.0)
    fwd = forward_segments(ar.bytes, edges, plan.fwd_s[r][s])
    bwd = backward_segments(ar.bytes, edges, plan.bwd_s[r][s])
    first = next(i for i, st in enumerate(steps) if isinstance(st, Forward))
    last = max(i for i, st in enumerate(steps) if isinstance(st, Backward))
    return [*all_gathers(ar, sizes), *steps[:first], *gather_waits(sizes, fwd), *steps[first:last],
            *reduce_scatters(ar, sizes, bwd), *steps[last:], *scatter_waits(sizes)]


def program_shape(plan: Plan, s: int, r: int) -> tuple:
    """What group (s, r)'s steps depend on besides r itself: groups of one stage with equal shapes have
    the same steps, their peers being the neighbouring stages of their own replica (lower_group). The
    simulator lowers one group per shape and shares its steps (tests/test_lower.py checks this). With the batch
    split by speed the replica's share is part of it."""
    share = (plan.microbatches_of(r),) if plan.replica_microbatches else ()
    if plan.diloco is not None:  # the inner all-reduce's ring is the DC's
        return (s, plan.fwd_s[r][s], plan.bwd_s[r][s], plan.stage_dc[r][s], *share)
    if plan.virtual_stages > 1:
        return (s, tuple(plan.chunk_fwd_s[r][s]), tuple(plan.chunk_bwd_s[r][s]))
    if plan.wgrad_s:
        return (s, plan.fwd_s[r][s], plan.bwd_s[r][s], plan.wgrad_s[r][s])
    return (s, plan.fwd_s[r][s], plan.bwd_s[r][s], *share)


def lower(plan: Plan, replicas: Iterable[int] | None = None) -> dict[str, Program]:
    """Programs of every group of `replicas` (default: all), in (replica, stage) order."""
    reps = range(plan.dp) if replicas is None else replicas
    reduces = [allreduce(plan, s) if plan.dp > 1 else None for s in range(plan.pp)]  # shared by the stage's groups
    return {group_name(s, r): lower_group(plan, s, r, reduces[s]) for r in reps for s in range(plan.pp)}


def collective_key(st: ReduceScatter | AllGather, group: str) -> tuple:
    """What names one bucketed collective alike in every member's program: op, bucket, bytes and members."""
    rings = st.rings if isinstance(st, ReduceScatter) else [next(r for r in st.rings if group in r)]
    return type(st).__name__, st.bucket, st.bytes, tuple(sorted(g for r in rings for g in r))


def dry_run(programs: dict[str, Program]) -> list[str]:
    """Check before anything starts that every send has its receive and that the programs cannot
    deadlock: run them with zero-time compute and instant delivery. Returns what is wrong (empty: fine)."""
    bad: list[str] = []
    sends: dict[tuple, int] = defaultdict(int)
    recvs: dict[tuple, int] = defaultdict(int)
    for p in programs.values():
        peers = {q.peer for q in p.pipes}
        for st in p.steps:
            if isinstance(st, Send | Recv) and st.peer not in peers:
                bad.append(f"{p.group}: {type(st).__name__} {st.kind}{st.microbatch} with {st.peer}, which has no pipe")
            if isinstance(st, Send):
                sends[(p.group, st.peer, st.kind, st.microbatch, st.chunk, st.bytes)] += 1
            elif isinstance(st, Recv):
                recvs[(st.peer, p.group, st.kind, st.microbatch, st.chunk, st.bytes)] += 1
    for key in sends.keys() | recvs.keys():
        if sends[key] != recvs[key]:
            src, dst, kind, mb, chunk, nbytes = key
            bad.append(f"{src} -> {dst} {kind}{mb} chunk {chunk} ({nbytes:g} bytes): {sends[key]} sent, "
                       f"{recvs[key]} received")
    if bad:
        return bad
    ptr = dict.fromkeys(programs, 0)
    arrived: set[tuple] = set()
    issued: dict[tuple, set[str]] = defaultdict(set)  # a bucketed collective -> the groups that issued it
    mine: dict[tuple, tuple] = {}  # (group, op, bucket) -> the collective it issued
    progress = True
    while progress:
        progress = False
        for name, p in programs.items():
            while ptr[name] < len(p.steps):
                st = p.steps[ptr[name]]
                if isinstance(st, Recv):
                    if (st.peer, name, st.kind, st.microbatch, st.chunk) not in arrived:
                        break
                elif isinstance(st, Send):
                    arrived.add((name, st.peer, st.kind, st.microbatch, st.chunk))
                elif isinstance(st, ReduceScatter | AllGather):
                    key = collective_key(st, name)
                    issued[key].add(name)
                    mine[(name, type(st).__name__, st.bucket)] = key
                elif isinstance(st, Await):  # a collective is done once every member has issued it
                    key = mine.get((name, st.collective, st.bucket))
                    if key is None or issued[key] != set(key[3]):
                        break
                ptr[name] += 1
                progress = True
    stuck = [f"{n} waits at step {ptr[n]} ({p.steps[ptr[n]]})" for n, p in programs.items() if ptr[n] < len(p.steps)]
    return [f"deadlock: {s}" for s in stuck]

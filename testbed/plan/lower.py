"""Plan -> programs: one typed step list per GPU group (testbed/program.py), executed alike by the
simulator and by emulated workers. Every decision an engine needs is made here once: each group's
host and port, the peer and bytes of each transfer, the connections of each pipe and the flow class
the Atlas sidecar shapes, and the all-reduce's algorithm and exchanges.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from testbed.plan.plan import Plan
from testbed.program import AllReduce, Backward, Forward, Pipe, Program, Recv, Send, Step
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


def pipeline_steps(plan: Plan, s: int, r: int, base: int = 0) -> list[Step]:
    """Group (s, r)'s part of the pipeline schedule, its microbatches numbered from `base`."""
    steps: list[Step] = []
    last = plan.pp - 1
    for op, i in plan.actions[s]:
        i += base
        if op == "F":
            if s > 0:
                steps.append(Recv("a", i, group_name(s - 1, r), plan.act_bytes[s - 1]))
            steps.append(Forward(i, plan.fwd_s[r][s]))
            if s < last:
                steps.append(Send("a", i, group_name(s + 1, r), plan.act_bytes[s]))
        else:
            if s < last:
                steps.append(Recv("g", i, group_name(s + 1, r), plan.act_bytes[s]))
            steps.append(Backward(i, plan.bwd_s[r][s]))
            if s > 0:
                steps.append(Send("g", i, group_name(s - 1, r), plan.act_bytes[s - 1]))
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
            steps.append(reduce or allreduce(plan, s))
    last = plan.pp - 1
    pipes = tuple(pipe(plan, s, r, q) for q in (s - 1, s + 1) if 0 <= q <= last)
    dc = plan.stage_dc[r][s]
    return Program(name, s, r, dc, host_index(plan, s, r), port(plan, s, r), plan.replica_offset_s[r],
                   tuple(steps), pipes)


def program_shape(plan: Plan, s: int, r: int) -> tuple:
    """What group (s, r)'s steps depend on besides r itself: groups of one stage with equal shapes have
    the same steps, their peers being the neighbouring stages of their own replica (lower_group). The
    simulator lowers one group per shape and shares its steps (tests/test_lower.py checks this)."""
    if plan.diloco is not None:  # the inner all-reduce's ring is the DC's
        return (s, plan.fwd_s[r][s], plan.bwd_s[r][s], plan.stage_dc[r][s])
    return (s, plan.fwd_s[r][s], plan.bwd_s[r][s])


def lower(plan: Plan, replicas: Iterable[int] | None = None) -> dict[str, Program]:
    """Programs of every group of `replicas` (default: all), in (replica, stage) order."""
    reps = range(plan.dp) if replicas is None else replicas
    reduces = [allreduce(plan, s) if plan.dp > 1 else None for s in range(plan.pp)]  # shared by the stage's groups
    return {group_name(s, r): lower_group(plan, s, r, reduces[s]) for r in reps for s in range(plan.pp)}


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
                sends[(p.group, st.peer, st.kind, st.microbatch, st.bytes)] += 1
            elif isinstance(st, Recv):
                recvs[(st.peer, p.group, st.kind, st.microbatch, st.bytes)] += 1
    for key in sends.keys() | recvs.keys():
        if sends[key] != recvs[key]:
            src, dst, kind, mb, nbytes = key
            bad.append(f"{src} -> {dst} {kind}{mb} ({nbytes:g} bytes): {sends[key]} sent, {recvs[key]} received")
    if bad:
        return bad
    ptr = dict.fromkeys(programs, 0)
    arrived: set[tuple] = set()
    progress = True
    while progress:
        progress = False
        for name, p in programs.items():
            while ptr[name] < len(p.steps):
                st = p.steps[ptr[name]]
                if isinstance(st, Recv):
                    if (st.peer, name, st.kind, st.microbatch) not in arrived:
                        break
                elif isinstance(st, Send):
                    arrived.add((name, st.peer, st.kind, st.microbatch))
                ptr[name] += 1
                progress = True
    stuck = [f"{n} waits at step {ptr[n]} ({p.steps[ptr[n]]})" for n, p in programs.items() if ptr[n] < len(p.steps)]
    return [f"deadlock: {s}" for s in stuck]

"""Lowered programs: every shipped experiment's plan lowers and dry-runs; programs survive JSON; a
malformed program or a send without its receive is caught before anything runs."""

from __future__ import annotations

import dataclasses

import pytest

from testbed.errors import SpecError
from testbed.plan.build import candidate_plans
from testbed.plan.lower import dry_run, lower
from testbed.program import AllReduce, Program, ProgramError, Send, exchanges
from testbed.sim.choose import build_plan
from testbed.spec.load import load_experiment
from tests.conftest import ROOT

EXPERIMENTS = sorted(p for p in (ROOT / "experiments").glob("*.yaml") if not p.stem.endswith("-topology"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_shipped_plan_lowers_and_dry_runs(path):
    """Every plan a shipped scheduler may run: for Atlas, each candidate its choice simulates (built here, not
    simulated, so the choice's simulations at 110k GPUs do not make this check minutes long)."""
    exp = load_experiment(path, sets=["bubbletea.trace=synthetic"])[0][0]
    checked = 0
    for sched in exp.schedulers:
        try:
            plans = candidate_plans(exp, sched)
        except SpecError:
            continue  # a scheduler this experiment cannot place is reported by `testbed sim`, not lowered
        for plan in plans:
            programs = lower(plan, range(min(plan.dp, 4)) if plan.dp > 64 else None)
            checked += 1
            if plan.dp > 64:
                continue  # a partial set of replicas cannot be dry-run (their all-reduce peers are missing)
            assert dry_run(programs) == [], (path.stem, sched, plan.meta)
    assert checked or exp.multitcp is not None


def test_programs_round_trip_through_json():
    exp = load_experiment(ROOT / "experiments" / "tiny-3dc.yaml")[0][0]
    for sched in ("dp-wan", "pp-wan", "atlas"):
        for p in lower(build_plan(exp, sched)).values():
            assert Program.from_json(p.to_json()) == p


def test_a_missing_receive_and_a_deadlock_are_caught():
    exp = load_experiment(ROOT / "experiments" / "tiny-3dc.yaml")[0][0]
    programs = lower(build_plan(exp, "pp-wan"))
    p = programs["s0r0"]
    i = next(k for k, st in enumerate(p.steps) if isinstance(st, Send))
    broken = dict(programs, s0r0=dataclasses.replace(p, steps=p.steps[:i] + p.steps[i + 1:]))
    assert any("1 received" in v for v in dry_run(broken))
    q = programs["s1r0"]  # receive microbatch 1 before 0: it waits for what its sender sends later
    recvs = [k for k, st in enumerate(q.steps) if type(st).__name__ == "Recv" and st.kind == "a"]
    steps = list(q.steps)
    steps[recvs[0]], steps[recvs[1]] = steps[recvs[1]], steps[recvs[0]]
    swapped = dict(programs, s1r0=dataclasses.replace(q, steps=tuple(steps)))
    assert dry_run(swapped) == [] or any("deadlock" in v for v in dry_run(swapped))


def test_malformed_programs_are_refused():
    p = lower(build_plan(load_experiment(ROOT / "experiments" / "tiny-3dc.yaml")[0][0], "pp-wan"))["s1r0"]
    text = p.to_json()
    for bad in (text.replace('"op":"Forward"', '"op":"Explode"'), text.replace('"microbatch":0', '"microbatch":"0"'),
                '{"group": 1}', "[]"):
        with pytest.raises(ProgramError):
            Program.from_json(bad)


def test_exchanges_follow_the_algorithm():
    ring = AllReduce("ring", 12.0, (("s0r0", "s0r1", "s0r2"),))
    ex = exchanges(ring, "s0r1")
    assert len(ex) == 4 and {(e.send_to, e.recv_from, e.bytes) for e in ex} == {("s0r2", "s0r0", 4.0)}
    hier = AllReduce("hierarchical", 12.0, (("s0r0", "s0r1"), ("s0r2", "s0r3")), (2, 2))
    ex = exchanges(hier, "s0r1")
    assert [(e.send_to, e.bytes) for e in ex] == [("s0r0", 6.0), ("s0r3", 3.0), ("s0r3", 3.0), ("s0r0", 6.0)]


def test_each_pipe_goes_to_its_peer_and_every_worker_accepts_what_its_peers_open():
    """Pipes are one-way, as NCCL's send connections: a group opens its pipe to each neighbour at the neighbour's
    port and sends on it only; what a worker expects to accept is what its peers' programs open towards it."""
    from types import SimpleNamespace

    from testbed.runtime.worker import connections_to_accept, connections_to_open

    exp = load_experiment(ROOT / "experiments" / "emu-3dc.yaml")[0][0]
    for sched in exp.schedulers:
        programs = lower(build_plan(exp, sched))
        opened: dict[str, int] = {}
        for p in programs.values():
            assert {q.peer for q in p.pipes} == {g for g, o in programs.items() if o.replica == p.replica
                                                  and abs(o.stage - p.stage) == 1}
            assert all(q.port == programs[q.peer].port for q in p.pipes)
            for peer, (n, _purpose) in connections_to_open(SimpleNamespace(program=p)).items():
                opened[peer] = opened.get(peer, 0) + n
        for g, p in programs.items():
            assert connections_to_accept(SimpleNamespace(program=p)) == opened.get(g, 0), (sched, g)

"""A WAN that changes: the simulator's re-rating against closed forms, the schedule, the spec's checks."""

from __future__ import annotations

import pytest

from testbed.errors import SpecError
from testbed.plan.network import link_changes, lower_network
from testbed.sim.executor import simulate, simulate_changing
from testbed.sim.linkchange import WanSchedule, WanState, union_length
from testbed.spec.load import validate
from testbed.spec.topology import Topology, WanLink
from tests.conftest import make_plan

A, C1 = 1e9, 1e9  # one activation of 1 GB on a link of 1 GB/s: alone, it takes 1 s


def schedule(*states: tuple[float, WanState]) -> WanSchedule:
    return WanSchedule({("a", "b"): ([t for t, _ in states], [s for _, s in states])})


def sends(tl, stage: int) -> list[tuple[float, float]]:
    return sorted((iv.start_s, iv.end_s) for iv in tl.intervals if iv.kind == "send" and iv.stage == stage)


def two_stage(**kw):
    args = {"pp": 2, "m": 1, "f": 1.0, "b": 1.0, "dcs": ["a", "b"], "act_bytes": A, "capacity": C1, "latency": 0.0}
    return make_plan(**{**args, **kw})


@pytest.mark.parametrize(("t_step", "C2"), [(1.4, 0.5e9), (1.1, 2e9), (1.9, 0.25e9)])
def test_capacity_step_mid_transfer(t_step, C2):
    """A transfer across a capacity step takes A1/C1 + (A - A1)/C2, A1 being what left before the step."""
    wan = schedule((0.0, WanState(C1, 0.0)), (t_step, WanState(C2, 0.0)))
    tl, _ = simulate_changing(two_stage(), wan, 0.0)
    (t0, t1), = sends(tl, 0)
    a1 = C1 * (t_step - t0)
    assert t1 - t0 == pytest.approx(a1 / C1 + (A - a1) / C2, rel=1e-12)
    # the gradient goes back at the new rate
    (g0, g1), = sends(tl, 1)
    assert g1 - g0 == pytest.approx(A / C2, rel=1e-12)


@pytest.mark.parametrize(("at", "down"), [(1.3, 0.5), (1.0, 2.0), (1.999, 0.25)])
def test_outage_adds_exactly_its_duration(at, down):
    """The only flow on a link that fails for d seconds finishes exactly d later; so does the iteration."""
    base, _ = simulate(two_stage())
    wan = schedule((0.0, WanState(C1, 0.0)), (at, WanState(C1, 0.0, up=False)), (at + down, WanState(C1, 0.0)))
    tl, sim = simulate_changing(two_stage(), wan, 0.0)
    (t0, t1), = sends(tl, 0)
    assert t1 - t0 == pytest.approx(A / C1 + down, rel=1e-12)
    assert tl.iteration_s[0] == pytest.approx(base.iteration_s[0] + down, rel=1e-12)
    assert sim.wan.stalls == [pytest.approx((at, at + down))]


def test_outage_with_no_transfer_waiting_costs_nothing():
    base, _ = simulate(two_stage())
    wan = schedule((0.0, WanState(C1, 0.0)), (0.2, WanState(C1, 0.0, up=False)), (0.9, WanState(C1, 0.0)))
    tl, sim = simulate_changing(two_stage(), wan, 0.0)
    assert tl.iteration_s[0] == pytest.approx(base.iteration_s[0], rel=1e-12)
    assert sim.wan.stalls == []


def test_schedule_clock_is_shifted_by_the_iteration_start():
    """An iteration that starts at t0 sees the change at t_step - t0 of its own clock."""
    t0, C2 = 10.0, 0.5e9
    wan = schedule((0.0, WanState(C1, 0.0)), (t0 + 1.5, WanState(C2, 0.0)))
    tl, _ = simulate_changing(two_stage(), wan, t0)
    (s0, s1), = sends(tl, 0)
    assert s1 - s0 == pytest.approx(0.5 + 0.5 * A / C2, rel=1e-12)


def test_latency_change_recaps_a_window_bound_transfer():
    """One connection of window W: a window per round trip (the ack clock). Half-way the latency doubles: the
    rounds that start after it take the new round trip (half the rate), and the transfer arrives one new
    latency after its last byte."""
    W, lat = 1e6, 0.01
    cap = W / (2 * lat)
    plan = two_stage(act_bytes=1e8, capacity=1e12, latency=lat, window=W)
    half = 1.0 + 0.5 * 1e8 / cap
    wan = schedule((0.0, WanState(1e12, lat)), (half, WanState(1e12, 2 * lat)))
    tl, _ = simulate_changing(plan, wan, 0.0)
    (t0, t1), = sends(tl, 0)
    # windows 0..49 start every 2 lat (the 50th round ends at the change), windows 50..99 every 4 lat after
    # that; the last takes W / C on the link
    assert t1 - t0 == pytest.approx(49 * 2 * lat + 50 * 4 * lat + W / 1e12, rel=1e-9)
    recv = [iv for iv in tl.intervals if iv.kind == "recv" and iv.stage == 1]
    assert recv[0].end_s == pytest.approx(t1 + 2 * lat, rel=1e-12)


@pytest.mark.parametrize("temporal", [False, True])
def test_outage_shifts_two_sharing_transfers_by_its_duration(temporal):
    """Two replicas' transfers on one link, fair or in turns: an outage while both wait delays each by d."""
    d = 0.7
    plan = make_plan(pp=2, dp=2, m=1, f=1.0, b=1.0, dcs=["a", "b"], act_bytes=A, capacity=C1, temporal=temporal)
    base, _ = simulate(plan)
    wan = schedule((0.0, WanState(C1, 0.0)), (1.2, WanState(C1, 0.0, up=False)), (1.2 + d, WanState(C1, 0.0)))
    tl, _ = simulate_changing(plan, wan, 0.0)
    assert [e for _, e in sends(tl, 0)] == pytest.approx([e + d for _, e in sends(base, 0)], rel=1e-12)


def test_no_change_replays_the_plain_simulation():
    """A schedule that never changes gives exactly the timeline of the plain simulator."""
    plan = make_plan(pp=3, dp=2, m=4, dcs=["a", "b", "b"], act_bytes=A, capacity=C1, latency=0.01, temporal=True)
    base, _ = simulate(plan)
    tl, _ = simulate_changing(plan, schedule((0.0, WanState(C1, 0.01))), 0.0)
    assert [iv for iv in tl.intervals] == [iv for iv in base.intervals]


def test_link_rates_are_recorded():
    wan = schedule((0.0, WanState(C1, 0.0)), (1.5, WanState(0.5e9, 0.0)))
    _, sim = simulate_changing(two_stage(), wan, 0.0)
    rates = sim.wan.link_rates()[("a", "b")]
    assert rates == [(1.0, C1), (1.5, 0.5e9), (2.5, 0.0)]  # starts, re-rated at the step, ends


def test_link_changes_merge_trace_and_outages():
    link = WanLink(between=("a", "b"), gbps=8, latency_ms=10,
                   trace=[{"t_s": 2, "gbps": 4, "latency_ms": 20}, {"t_s": 6, "gbps": 8, "latency_ms": 10}],
                   events=[{"at_s": 3, "down_for_s": 1}])
    times, states = [t for t, _ in link_changes(link)], [st for _, st in link_changes(link)]
    assert times == [0.0, 2.0, 3.0, 4.0, 6.0]
    assert [(s.gbps, s.latency_s, s.up) for s in states] == [
        (8, 0.01, True), (4, 0.02, True), (4, 0.02, False), (4, 0.02, True), (8, 0.01, True)]
    wan = WanSchedule({("a", "b"): (times, states)})
    assert wan.state_at(("a", "b"), 3.5).up is False
    assert wan.outages() == [(("a", "b"), 3.0, 4.0)]


def test_union_length():
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert union_length([(0, 2), (1, 3), (5, 6)], 2.5, 5.5) == 1.0


def _topo(link: dict) -> dict:
    return {"dcs": [{"name": "a", "gpus": 8}, {"name": "b", "gpus": 8}],
            "links": [{"between": ["a", "b"], "gbps": 10, "latency_ms": 5, **link}]}


@pytest.mark.parametrize(("link", "field", "words"), [
    ({"trace": [{"t_s": 2, "gbps": 1, "latency_ms": 1}, {"t_s": 1, "gbps": 1, "latency_ms": 1}]},
     "topology.links.0.trace.1.t_s", "increasing"),
    ({"events": [{"at_s": 1, "down_for_s": 2}, {"at_s": 2, "down_for_s": 1}]}, "topology.links.0.events.1.at_s",
     "overlap"),
    ({"trace": [{"t_s": 0, "gbps": 1e9, "latency_ms": 1}]}, "topology.links.0.trace.0.gbps", "100,000"),
    ({"events": [{"at_s": -1, "down_for_s": 1}]}, "topology.links.0.events.0.at_s", "out of range"),
    ({"events": [{"at_s": 1, "down_for_s": 0}]}, "topology.links.0.events.0.down_for_s", "out of range"),
    ({"trace": "/nonexistent/trace.csv"}, "topology.links.0.trace", "cannot read"),
])
def test_bad_schedules_are_one_line_errors(link, field, words):
    with pytest.raises(SpecError) as e:
        validate(Topology, _topo(link), "topology")
    assert str(e.value).startswith(field) and words in str(e.value) and "\n" not in str(e.value)


def test_trace_file_is_read_and_checked(tmp_path):
    good = tmp_path / "t.csv"
    good.write_text("t_s,gbps,latency_ms\n0,10,5\n# a comment\n1.5,2.5,7\n")
    topo = validate(Topology, _topo({"trace": str(good)}), "topology")
    assert [(p.t_s, p.gbps, p.latency_ms) for p in topo.links[0].trace] == [(0, 10, 5), (1.5, 2.5, 7)]
    bad = tmp_path / "bad.csv"
    bad.write_text("t_s,gbps,latency_ms\n0,ten,5\n")
    with pytest.raises(SpecError, match="bad.csv line 2"):
        validate(Topology, _topo({"trace": str(bad)}), "topology")
    nohead = tmp_path / "nohead.csv"
    nohead.write_text("0,10,5\n")
    with pytest.raises(SpecError, match="header"):
        validate(Topology, _topo({"trace": str(nohead)}), "topology")


def test_changing_run_is_deterministic_and_replans_each_iteration(tmp_path):
    from testbed.runs.simulated import run_experiment, write_outputs
    from testbed.spec.load import load_experiment
    from tests.conftest import ROOT

    pts = load_experiment(ROOT / "experiments" / "wan-change.yaml")
    a = write_outputs(tmp_path / "a", run_experiment(pts, jobs=1))
    b = write_outputs(tmp_path / "b", run_experiment(pts, jobs=1))
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    names = {p.name for p in a}
    assert {"linkrates.csv", "linkchanges.csv", "iterations.csv"} <= names
    import csv

    its = list(csv.DictReader((tmp_path / "a" / "iterations.csv").read_text().splitlines()))
    atlas = [float(r["iteration_s"]) for r in its if r["scheduler"] == "atlas"]
    # the iterations before any change, and long after the last, are the plain repeated one
    assert atlas[0] == atlas[1] == atlas[-1] and max(atlas) > atlas[0]
    stalls = [float(r["wan_stall_s"]) for r in its if r["scheduler"] == "atlas"]
    assert sum(1 for s in stalls if s > 0) == 1 and 0 < max(stalls) <= 0.4 + 1e-9
    summary = list(csv.DictReader((tmp_path / "a" / "summary.csv").read_text().splitlines()))
    assert all(float(r["wan_stall_s"]) > 0 for r in summary)


def test_unchanging_topology_writes_no_wan_outputs(tmp_path):
    from testbed.runs.simulated import run_experiment, write_outputs
    from testbed.spec.load import load_experiment
    from tests.conftest import ROOT

    paths = write_outputs(tmp_path, run_experiment(load_experiment(ROOT / "experiments" / "tiny-3dc.yaml"), jobs=1))
    assert not {"linkrates.csv", "linkchanges.csv", "iterations.csv"} & {p.name for p in paths}
    assert "wan_stall_s" not in (tmp_path / "summary.csv").read_text().splitlines()[0]


def test_changed_iterations_cover_each_engines_boundaries():
    from testbed.runs.emulated import changed_iterations

    wan = schedule((0.0, WanState(C1, 0.0)), (1.2, WanState(C1 / 2, 0.0)), (2.6, WanState(C1, 0.0)))
    # one engine's iterations put the changes in 1 and 2, the other's in 1 and 3
    assert changed_iterations(wan, [[1.0, 1.0, 1.0, 1.0], [0.7, 0.7, 1.0, 1.0]]) == (1, 3)
    assert changed_iterations(schedule((0.0, WanState(C1, 0.0))), [[1.0, 1.0]]) == (0, -1)


def test_a_changing_wan_keeps_the_runs_placement():
    """Each iteration is re-planned from the WAN as it is (connections, stagger, warm-up), but a running job's
    stages stay in their DCs: Atlas's chain prefers fat links, and the shipped trace's drop to 4 Gbit/s would
    otherwise move stages between DCs mid-run, which neither the workers nor a real job do."""
    from pathlib import Path

    from testbed.plan.build import resolve_dp
    from testbed.runs.simulated import simulate_changing_run
    from testbed.sim.linkchange import WanSchedule
    from testbed.spec.load import load_experiment

    exp = load_experiment(Path(__file__).resolve().parent.parent / "experiments" / "wan-change.yaml")[0][0]
    wan = WanSchedule.from_net(lower_network(exp.topology))
    plans, *_ = simulate_changing_run(exp, "atlas", "keep", resolve_dp(exp), wan)
    assert len({tuple(map(tuple, p.stage_dc)) for p in plans}) == 1
    assert len({tuple(p.links[k].capacity_bytes_s for k in sorted(p.links)) for p in plans}) > 1  # re-planned

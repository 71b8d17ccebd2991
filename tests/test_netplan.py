"""The lowered network (testbed/net/links.py, built by testbed/plan/network.py): real-world units, k applied in one
place (testbed/net/scale.py), and read by the simulator's plan and the emulator alike instead of the topology."""

from __future__ import annotations

import re

import pytest

from testbed.net.scale import MIN_WINDOW, link_mss
from testbed.plan.build import resolve_dp
from testbed.plan.network import covering_connections, link_plans, lower_network, opened_connections
from testbed.sim.choose import build_plan
from testbed.spec.load import load_experiment
from tests.conftest import ROOT

EXP = load_experiment(ROOT / "experiments" / "emu-3dc.yaml")[0][0]


def test_an_unscaled_network_is_the_spec_in_real_world_units():
    topo = EXP.topology
    net = lower_network(topo)
    assert net.scale is None and len(net.links) == len(topo.links)
    for spec, link in zip(topo.links, net.links, strict=True):
        assert link.between == spec.between and link.emulated is None
        assert link.capacity_bytes_s == spec.gbps * 1e9 / 8 and link.latency_s == spec.latency_ms / 1e3
        assert link.window_bytes == topo.window_mb(spec) * 2**20


@pytest.mark.parametrize("k", [1.0, 37.0, 500.0, 5000.0])
def test_a_scaled_network_models_the_links_the_emulator_builds(k):
    net = lower_network(EXP.topology, k)
    for link in net.links:
        e = link.emulated
        assert e is not None and e.scale == k
        assert e.rate_bps * k / 8 == pytest.approx(link.capacity_bytes_s)  # rates divided by k
        assert e.latency_s == link.latency_s  # latencies are not scaled
        assert e.window_bytes >= MIN_WINDOW - e.mss / 2 and e.window_bytes % e.mss == 0  # whole segments
        assert e.mss == link_mss(e.rate_bps)
        assert link.window_bytes == e.window_bytes * k  # the plan's window: what one emulated connection carries
        assert link.turn_bytes == pytest.approx(k * 2 * (e.mtu + 14))  # k x the HTB quantum


def test_a_link_keeps_its_built_window_when_its_rate_changes():
    built = lower_network(EXP.topology, 500.0)
    spec = EXP.topology.links[0]
    slower = EXP.topology.model_copy(update={"links": [spec.model_copy(update={"gbps": spec.gbps / 10}),
                                                       *EXP.topology.links[1:]]})
    now = lower_network(slower, built=built)
    assert now.links[0].capacity_bytes_s == pytest.approx(built.links[0].capacity_bytes_s / 10)
    assert now.links[0].window_bytes == built.links[0].window_bytes
    assert now.links[0].emulated == built.links[0].emulated  # the hosts' routes and classes stay as built
    assert now.links[1:] == built.links[1:]


def test_the_plan_is_built_on_the_lowered_network():
    built = lower_network(EXP.topology, 500.0)
    for sched in EXP.schedulers:
        plan = build_plan(EXP, sched, dp=resolve_dp(EXP), built=built)
        assert plan.net is not None and plan.net.links == built.links
        for (a, b), lp in plan.links.items():
            link = built.link(a, b)
            assert (lp.capacity_bytes_s, lp.latency_s, lp.window_bytes, lp.turn_bytes) == (
                link.capacity_bytes_s, link.latency_s, link.window_bytes, link.turn_bytes)


def test_a_changing_wan_opens_at_least_every_iterations_connections():
    built = lower_network(EXP.topology, 500.0)
    sched = next(s for s in EXP.schedulers if "mtcp" in s or s == "atlas")
    plan = build_plan(EXP, sched, dp=resolve_dp(EXP), built=built)
    link = built.links[0]
    slower = {link.between: [(link.capacity_bytes_s * 4, link.latency_s * 2)]}  # a bigger product: more connections
    opened = opened_connections(EXP, plan.mech, built, slower)
    planned = link_plans(EXP, plan.mech, built)
    assert all(opened[pair] >= lp.connections for pair, lp in planned.items())
    assert opened[link.between] > planned[link.between].connections
    assert covering_connections(built, 10_000) >= max(lp.connections for lp in planned.values())


# The emulator's modules and the simulator's changing WAN read a link's rate, latency, window and schedule from the
# lowered network (Emulation.link, NetLink.changes), never from the topology; emu/scale.py and emu/headroom.py choose
# k from the spec before anything is lowered, and launch/dilation.py compares the spec with what was built, so those
# read both.
RE_READS = re.compile(r"\.gbps \* 1e9|latency_ms / 1e3|window_mb\(|\.topo\.links?\b|"
                      r"\blink\.(gbps|latency_ms|trace|events)\b")


EMULATOR = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "testbed" / "emu").glob("*.py")
                  if p.name not in ("scale.py", "headroom.py"))


@pytest.mark.parametrize("path", EMULATOR + ["testbed/launch/wan.py", "testbed/launch/windows.py",
                                             "testbed/launch/sharing.py", "testbed/runs/multitcp.py",
                                             "testbed/runs/emulated.py", "testbed/sim/linkchange.py",
                                             "testbed/bubbletea/emulated.py", "testbed/bubbletea/kvdelay.py"])
def test_the_emulator_does_not_re_read_links_from_the_topology(path):
    hits = [line.strip() for line in (ROOT / path).read_text().splitlines() if RE_READS.search(line)]
    assert not hits, f"{path} re-derives a link from the topology: {hits}"


def test_an_emulated_run_refuses_a_plan_of_another_scale():
    """A plan built on the network at one k, run on an emulation at another, would have the simulator predict
    windows and turns the emulator does not build: refused before anything starts."""
    from testbed.emu.backends.netns import NetnsBackend
    from testbed.emu.build import Emulation
    from testbed.emu.names import address_plan
    from testbed.emu.sh import EmuError
    from testbed.emu.train import run_training

    emu = Emulation("gdtbz", EXP.topology, NetnsBackend("gdtbz"), address_plan(EXP.topology, "gdtbz"), 500.0, "netem")
    assert emu.net.links == lower_network(EXP.topology, 500.0).links  # the network `up` builds from
    plan = build_plan(EXP, EXP.schedulers[0], dp=resolve_dp(EXP), built=lower_network(EXP.topology, 200.0))
    with pytest.raises(EmuError, match="k=200.*k=500"):
        run_training(plan, emu, 1)

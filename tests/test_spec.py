"""Bad input fails before anything runs, with one line naming the field."""

from __future__ import annotations

import pytest

from testbed.errors import SpecError
from testbed.sim.choose import build_plan
from testbed.spec.load import load_experiment, set_dotted, validate
from testbed.spec.topology import Topology
from tests.conftest import ROOT

GOOD_TOPO = {
    "dcs": [{"name": "a", "gpus": 64}, {"name": "b", "gpus": 64}],
    "links": [{"between": ["a", "b"], "gbps": 100, "latency_ms": 10}],
}


def topo_error(mutate) -> str:
    import copy

    data = copy.deepcopy(GOOD_TOPO)
    mutate(data)
    with pytest.raises(SpecError) as e:
        validate(Topology, data, "topology")
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_good_topology_loads():
    t = validate(Topology, GOOD_TOPO)
    assert t.link("b", "a").gbps == 100


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (lambda d: d["links"][0].update(between=["a", "zz"]), "topology.links[0].between", "unknown DC"),
        (lambda d: d["links"][0].update(latency_ms=-1), "topology.links.0.latency_ms", "from 0 to 10,000 ms"),
        (lambda d: d["links"][0].update(latency_ms=1e308), "topology.links.0.latency_ms", "out of range"),
        (lambda d: d["links"][0].update(gbps=0), "topology.links.0.gbps", "from 0.001 to 100,000 Gbit/s"),
        (lambda d: d["links"][0].update(gbps=1e-300), "topology.links.0.gbps", "out of range"),
        (lambda d: d["links"][0].update(gbps=float("inf")), "topology.links.0.gbps", "not a finite number"),
        (lambda d: d["links"][0].update(gbps=float("nan")), "topology.links.0.gbps", "not a finite number"),
        (lambda d: d["links"][0].update(gbps=True), "topology.links.0.gbps", "not a number"),
        (lambda d: d.update(tcp_window_mb=float("inf")), "topology.tcp_window_mb", "not a finite number"),
        (lambda d: d.update(tcp_window_mb=4096), "topology.tcp_window_mb", "TCP's largest window"),
        (lambda d: d["dcs"][0].update(gpus=2**70), "topology.dcs.0.gpus", "out of range"),
        (lambda d: d["dcs"][0].update(name="lo"), "topology.dcs.0.name", "kernel network interface"),
        (lambda d: d.update(name="two\nlines"), "topology.name", "control character"),
        (lambda d: d["dcs"][1].update(name="a"), "topology.dcs[1].name", "duplicate"),
        (lambda d: d["dcs"][0].update(name="bad name;rm"), "topology.dcs.0.name", "safe name"),
        (lambda d: d["dcs"][0].update(gpu="V100"), "topology.dcs.0.gpu", "unknown GPU"),
        (lambda d: d["dcs"][0].update(colour="red"), "topology.dcs.0.colour", "unknown field"),
        (lambda d: d["links"][0].update(between=["a", "a"]), "topology.links.0", "distinct"),
    ],
)
def test_bad_topology_names_the_field(mutate, field, words):
    msg = topo_error(mutate)
    assert msg.startswith(field), msg
    assert words in msg


def _exp(tmp_path, workload: dict, schedulers=("pp-wan", "atlas")) -> str:
    import yaml

    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump({"topology": GOOD_TOPO, "workload": workload, "schedulers": list(schedulers)}))
    return str(p)


@pytest.mark.parametrize(
    ("workload", "field", "words"),
    [
        ({"model": "tiny", "tp": 3, "pp": 2, "dp": 1, "global_batch": 8}, "workload.tp", "does not divide"),
        ({"model": "tiny", "tp": 1, "pp": 9, "dp": 1, "global_batch": 8}, "workload.pp", "stages for a 4-layer"),
        ({"model": "gpt3-175b", "tp": 8, "pp": 2, "dp": 1, "global_batch": 8}, "workload", "needs"),
        ({"model": "nope", "tp": 1, "pp": 2, "dp": 1}, "workload.model", "unknown model"),
        ({"model": "tiny", "tp": 2, "pp": 4, "dp": 32, "global_batch": 64}, "workload", "need"),
        ({"model": "tiny", "tp": 1, "pp": 2, "dp": 3, "global_batch": 8}, "workload.dp", "does not divide"),
        ({"model": "tiny", "tp": 1, "pp": 2, "global_batch": 3, "microbatch": 2}, "workload.global_batch",
         "not a multiple of microbatch=2"),
        ({"model": "tiny", "tp": 1, "pp": 2, "global_batch": 3, "microbatch": 2, "dp": 2}, "workload.global_batch",
         "not a multiple"),
        ({"model": "tiny", "tp": 1, "pp": 2, "global_batch": "1e9"}, "workload.global_batch", "text to YAML"),
        ({"model": "tiny", "tp": 1, "pp": 2, "global_batch": 10**9}, "workload.global_batch", "out of range"),
        ({"model": "tiny", "tp": 1, "pp": 4, "dp": 1, "global_batch": 1_000_000}, "workload.global_batch",
         "in one replica's program, more than the simulator takes"),
        ({"model": "tiny", "tp": 1, "pp": 2, "dp": "two"}, "workload.dp", "whole number or auto"),
        ({"model": {"layers": 0, "hidden": 8, "heads": 2}, "tp": 1, "pp": 2}, "workload.model.layers", "out of range"),
        ({"model": {"layers": 4, "hidden": 100, "heads": 3}, "tp": 1, "pp": 2}, "workload.model",
         "not divisible by heads"),
        ({"model": "tiny", "tp": 1, "pp": 2, "mfu": float("nan")}, "workload.mfu", "not a finite number"),
    ],
)
def test_bad_workload_names_the_field(tmp_path, workload, field, words):
    with pytest.raises(SpecError) as e:
        for exp, _ in load_experiment(_exp(tmp_path, workload)):
            build_plan(exp, "atlas")
    assert str(e.value).startswith(field), str(e.value)
    assert words in str(e.value)


def test_unknown_scheduler(tmp_path):
    with pytest.raises(SpecError) as e:
        load_experiment(_exp(tmp_path, {"model": "tiny"}, ["pp-wan+warp"]))
    assert str(e.value).startswith("schedulers") and "unknown mechanism" in str(e.value)


def test_set_dotted_wildcard_and_index():
    d = {"links": [{"x": 1}, {"x": 2}], "a": {}}
    set_dotted(d, "links.*.x", 5)
    set_dotted(d, "links.1.y", 7)
    set_dotted(d, "a.b.c", 1)
    assert d == {"links": [{"x": 5}, {"x": 5, "y": 7}], "a": {"b": {"c": 1}}}
    with pytest.raises(SpecError):
        set_dotted(d, "links.9.x", 1)


def test_sweep_expands_in_order(tmp_path):
    pts = load_experiment(_exp(tmp_path, {"model": "tiny", "tp": 1, "pp": 2, "global_batch": 8}),
                          sweeps=["topology.links.*.latency_ms=1,2", "workload.microbatch=1,2"])
    assert [p for _, p in pts] == [
        {"topology.links.*.latency_ms": 1, "workload.microbatch": 1},
        {"topology.links.*.latency_ms": 1, "workload.microbatch": 2},
        {"topology.links.*.latency_ms": 2, "workload.microbatch": 1},
        {"topology.links.*.latency_ms": 2, "workload.microbatch": 2},
    ]
    assert pts[2][0].topology.links[0].latency_ms == 2


def test_initial_window_follows_slow_start_after_idle_unless_set():
    from testbed.spec.experiment import NetworkOptions

    assert NetworkOptions().host_tcp["warm_windows"]
    # a restart to the full window is none
    assert not NetworkOptions(tcp_slow_start_after_idle=True).host_tcp["warm_windows"]
    assert not NetworkOptions(tcp_initial_window="kernel").host_tcp["warm_windows"]
    with pytest.raises(ValueError, match="tcp_initial_window: 'window' restarts"):
        NetworkOptions(tcp_slow_start_after_idle=True, tcp_initial_window="window")


def test_set_topology_file_loads_it_and_a_missing_one_names_the_field(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    ((exp, _),) = load_experiment(ROOT / "experiments" / "tiny-3dc.yaml", ["topology=topologies/3dc.yaml"])
    assert exp.topology.name == "3dc"
    monkeypatch.chdir(tmp_path)  # relative to where the command runs
    with pytest.raises(SpecError, match="topology.*not found"):
        load_experiment(ROOT / "experiments" / "tiny-3dc.yaml", ["topology=topologies/3dc.yaml"])


def test_dp_auto_never_drops_the_wan_from_dp_wan():
    # tiny-3dc's batch fits every replica in one DC: dp-wan there would be no DP across DCs
    with pytest.raises(SpecError, match="workload.dp.*every dp-wan replica in"):
        ((exp, _),) = load_experiment(ROOT / "experiments" / "tiny-3dc.yaml",
                                      ["schedulers=[dp-wan]", "workload.dp=auto"])
        build_plan(exp, "dp-wan")
    # pinned across two DCs, auto takes the pins' total and the plan crosses the WAN
    ((exp, _),) = load_experiment(ROOT / "experiments" / "tiny-3dc.yaml",
                                  ["schedulers=[dp-wan]", "workload.dp=auto",
                                   "workload.replicas_per_dc={useast: 1, uswest: 1}"])
    plan = build_plan(exp, "dp-wan")
    assert plan.dp == 2 and len({row[0] for row in plan.stage_dc}) == 2
    # a pipeline scheduler is untouched: auto may keep it in one DC
    ((exp, _),) = load_experiment(ROOT / "experiments" / "tiny-3dc.yaml", ["schedulers=[pp-wan]", "workload.dp=auto"])
    assert build_plan(exp, "pp-wan").dp > 0


def _two_dcs(link: dict) -> dict:
    return {"dcs": [{"name": "a", "gpu": "H100", "gpus": 8}, {"name": "b", "gpu": "H100", "gpus": 8}],
            "links": [{"between": ["a", "b"], **link}]}


def test_a_pairs_circuits_bundle_into_one_link_and_an_outage_takes_one_down():
    from testbed.plan.network import lower_network

    spec = _two_dcs({"circuits": [{"gbps": 400, "latency_ms": 31},
                                  {"gbps": 100, "latency_ms": 33, "events": [{"at_s": 10, "down_for_s": 5}]}]})
    topo = validate(Topology, spec, "topology")
    link = topo.links[0]
    assert (link.gbps, link.latency_ms) == (500, 33)  # summed rate; a striped transfer waits for the farthest
    assert [(p.t_s, p.gbps, p.latency_ms) for p in link.trace] == [(10, 400, 31), (15, 500, 33)]
    assert link.events == []
    steps = lower_network(topo).links[0].changes
    assert [(t, st.gbps) for t, st in steps] == [(0.0, 500), (10.0, 400), (15.0, 500)]  # WanState keeps Gbit/s
    # both down at once: an outage of the link for as long as neither is up
    spec["links"][0]["circuits"][0]["events"] = [{"at_s": 12, "down_for_s": 6}]
    link = validate(Topology, spec, "topology").links[0]
    assert [(e.at_s, e.down_for_s) for e in link.events] == [(12, 3)]
    # a run's spec.yaml (derived fields written out) reads back as the same topology
    assert validate(Topology, topo.model_dump(mode="json"), "topology") == topo


def test_circuits_refuse_what_they_derive_and_a_second_link_points_to_them():
    with pytest.raises(SpecError, match="gbps: set by the link's circuits"):
        validate(Topology, _two_dcs({"gbps": 100, "circuits": [{"gbps": 400, "latency_ms": 31},
                                                               {"gbps": 400, "latency_ms": 31}]}), "topology")
    with pytest.raises(SpecError, match="circuits"):
        validate(Topology, _two_dcs({"circuits": [{"gbps": 400, "latency_ms": 31}]}), "topology")  # one circuit
    many = [{"at_s": 2.0 * i, "down_for_s": 1.0} for i in range(50_001)]  # bounded: one pass, never a hang
    with pytest.raises(SpecError, match="outages in all"):
        validate(Topology, _two_dcs({"circuits": [{"gbps": 400, "latency_ms": 31, "events": many},
                                                  {"gbps": 400, "latency_ms": 31}]}), "topology")
    spec = _two_dcs({"gbps": 400, "latency_ms": 31})
    spec["links"].append({"between": ["b", "a"], "gbps": 400, "latency_ms": 31})
    with pytest.raises(SpecError, match="circuits:"):
        validate(Topology, spec, "topology")

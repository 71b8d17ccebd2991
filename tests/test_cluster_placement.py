"""The cluster spec and the placement of DCs on machines (testbed/spec/cluster.py, testbed/cluster/placement.py):
pure, no machines needed."""

from __future__ import annotations

import pytest

from testbed.cluster.placement import (
    VXLAN_OVERHEAD_BYTES,
    assign,
    plan_cluster,
    tunnel_ips,
    underlay_bps,
    underlay_mtu_needed,
)
from testbed.emu.names import address_plan
from testbed.errors import SpecError
from testbed.spec.cluster import Cluster, Machine
from testbed.spec.load import load_cluster, load_topology
from tests.conftest import ROOT

TOPO = load_topology(ROOT / "experiments" / "emu-3dc-topology.yaml")
THREE = [Machine(name=f"m{i}", address=f"10.0.0.{10 + i}") for i in range(3)]


def test_round_robin_puts_one_dc_per_machine_in_order() -> None:
    assert assign(TOPO, THREE, {}) == {"useast": "m0", "uscentral": "m1", "uswest": "m2"}


def test_explicit_placement_wins_and_the_rest_go_round_robin() -> None:
    got = assign(TOPO, THREE[:2], {"uswest": "m0"})
    assert got["uswest"] == "m0"
    assert [got["useast"], got["uscentral"]] == ["m0", "m1"]


def test_every_link_is_built_once_whole_or_as_two_halves() -> None:
    for machines, placement in ((THREE, {}), (THREE[:2], {}), (THREE[:1], {}), (THREE, {"uswest": "m0"})):
        plan = plan_cluster(TOPO, Cluster(machines=machines, placement=placement))
        whole = [k for p in plan.parts.values() for k in p.links]
        halves = [h.link for p in plan.parts.values() for h in p.halves]
        assert sorted(whole + sorted(set(halves))) == list(range(len(TOPO.links)))
        assert not set(whole) & set(halves)
        assert all(halves.count(k) == 2 for k in halves)  # a tunnel has its two ends
        for k in whole:  # a link built whole has both its DCs on that machine
            (m,) = [n for n, p in plan.parts.items() if k in p.links]
            assert {plan.dc_machine[dc] for dc in TOPO.links[k].between} == {m}


def test_a_tunnels_two_halves_mirror_each_other() -> None:
    plan = plan_cluster(TOPO, Cluster(machines=THREE))
    halves = {(h.link, name): h for name, p in plan.parts.items() for h in p.halves}
    for (k, name), h in halves.items():
        other = halves[(k, h.peer_machine)]
        assert (other.here, other.peer) == (h.peer, h.here)
        assert (other.local_address, other.remote_address) == (h.remote_address, h.local_address)
        assert (other.tunnel_ip, other.peer_tunnel_ip) == (h.peer_tunnel_ip, h.tunnel_ip)
        assert other.vni == h.vni
        assert plan.dc_machine[h.here] == name != h.peer_machine
    assert len({h.vni for h in halves.values()}) == len(TOPO.links)


def test_tunnel_addresses_are_outside_the_links_other_subnets() -> None:
    addr = address_plan(TOPO, "gdtbcl")
    used = {ip for w in addr.wans for ip in (w.gw_a_ip, w.wan_a_ip, w.gw_b_ip, w.wan_b_ip)}
    for k in range(len(TOPO.links)):
        assert not set(tunnel_ips(k)) & used


def test_machines_without_a_dc_build_nothing() -> None:
    four = [*THREE, Machine(name="m3", address="10.0.0.13")]
    assert set(plan_cluster(TOPO, Cluster(machines=four)).parts) == {"m0", "m1", "m2"}


def test_node_names_map_to_their_dcs_machine() -> None:
    plan = plan_cluster(TOPO, Cluster(machines=THREE))
    addr = address_plan(TOPO, "gdtbcl")
    for h in addr.hosts:
        assert plan.machine_of_node(h.ns, "gdtbcl") == plan.dc_machine[h.dc]


def test_vxlan_overhead_on_the_cluster_network() -> None:
    assert underlay_mtu_needed(9000) == 9000 + VXLAN_OVERHEAD_BYTES
    assert underlay_bps(200e6, 9000) > 200e6
    assert underlay_bps(200e6, 9000) == pytest.approx(200e6 * 9050 / 9014)
    assert underlay_bps(200e6, 1500) / 200e6 > underlay_bps(200e6, 9000) / 200e6  # small packets cost more


@pytest.mark.parametrize("data, field", [
    ({"machines": [{"name": "m0", "address": "10.0.0.1"}, {"name": "m0", "address": "10.0.0.2"}]}, "name"),
    ({"machines": [{"name": "m0", "address": "10.0.0.1"}, {"name": "m1", "address": "10.0.0.1"}]}, "address"),
    ({"machines": [{"name": "m0", "address": "node-a"}]}, "address"),
    ({"machines": [{"name": "M 0", "address": "10.0.0.1"}]}, "name"),
    ({"machines": [{"name": "m0", "address": "10.0.0.1"}], "placement": {"useast": "m9"}}, "placement"),
    ({"tunnel": "ipip"}, "tunnel"),
    ({"nodes": []}, "nodes"),
])
def test_bad_cluster_specs_name_the_field(tmp_path, data, field) -> None:
    import yaml

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as e:
        load_cluster(path)
    assert field in str(e.value)


def test_placement_of_an_unknown_dc_is_refused() -> None:
    with pytest.raises(SpecError, match="no DC 'mars'"):
        plan_cluster(TOPO, Cluster(machines=THREE, placement={"mars": "m0"}))


def test_gre_is_not_yet() -> None:
    with pytest.raises(SpecError, match="not yet"):
        plan_cluster(TOPO, Cluster(machines=THREE, tunnel="gre"))


def test_no_machines_is_refused() -> None:
    with pytest.raises(SpecError, match="no machines"):
        plan_cluster(TOPO, Cluster())


def test_the_drivers_commands_go_to_the_machine_that_holds_the_namespace() -> None:
    from testbed.cluster.driver import Agents, ClusterBackend
    from testbed.emu.sh import EmuError

    plan = plan_cluster(TOPO, Cluster(machines=THREE[:2]))  # useast and uswest on m0, uscentral on m1
    be = ClusterBackend("gdtbcl", plan, Agents({}, {}), TOPO)
    addr = address_plan(TOPO, "gdtbcl")
    for h in addr.hosts:
        assert be.machine(be.nodes[h.ns]) == plan.dc_machine[h.dc]
    whole = addr.wan("useast", "uswest")
    assert be.machine(be.nodes[whole.ns]) == "m0"
    split = be.nodes[addr.wan("useast", "uscentral").ns]
    # each direction's device is in the half that sends into it: towards uscentral on useast's machine
    assert be.machine(split, ["tc", "class", "add", "dev", "uscentral"]) == "m0"
    assert be.machine(split, ["iptables", "-A", "POSTROUTING", "-o", "useast"]) == "m1"
    with pytest.raises(EmuError, match="not yet"):
        be.machine(split, ["tc", "-s", "qdisc", "show"])


def test_bubbleteas_processes_on_a_cluster_are_refused_as_not_yet() -> None:
    from testbed.cluster.driver import Agents, ClusterBackend
    from testbed.errors import NotYetError

    plan = plan_cluster(TOPO, Cluster(machines=THREE[:2]))
    be = ClusterBackend("gdtbcl", plan, Agents({}, {}), TOPO)
    host = be.nodes[address_plan(TOPO, "gdtbcl").hosts[0].ns]
    for node, module in ((None, "testbed.bubbletea.service"), (host, "testbed.bubbletea.decode")):
        with pytest.raises(NotYetError, match=f"{module} on a cluster: not yet"):
            be.spawn(node, module, [])


def test_a_predictive_sidecar_on_a_cluster_is_refused_before_anything_is_built() -> None:
    from testbed.errors import NotYetError
    from testbed.runs.emulated import check_cluster_point
    from testbed.spec.load import load_experiment
    from tests.conftest import ROOT

    ((exp, _),) = load_experiment(ROOT / "experiments" / "emu-3dc.yaml", ["network.sidecar=predictive"])
    with pytest.raises(NotYetError, match="network.sidecar: predictive on a cluster"):
        check_cluster_point(exp, 1, capture=False)

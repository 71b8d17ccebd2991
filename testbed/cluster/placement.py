"""Which machine holds which DC, and what each machine builds. Pure: no side effects, unit-tested.

A DC's hosts, gateway and LAN are on one machine. A WAN link between two DCs on one machine is built there as on
a single machine. A link between DCs on different machines is split in two halves, one per machine: each half is
the link's WAN namespace with the gateway's veth on one side and a VXLAN tunnel to the other machine on the other,
and shapes and delays the traffic it sends into the tunnel (its DC -> the peer DC), as the single-machine WAN
namespace shapes each direction once on the way out.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.errors import SpecError
from testbed.spec.cluster import Cluster, Machine
from testbed.spec.topology import Topology

# VXLAN's encapsulation per packet: outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8 bytes. The shaper counts the
# inner frame (Ethernet header + IP packet), as on a local veth, so the link's rate is the same either way; the
# cluster network carries these bytes on top, and its MTU must hold the inner frame's IP packet plus them.
VXLAN_OVERHEAD_BYTES = 50
ETHERNET_HEADER_BYTES = 14


@dataclass(frozen=True)
class Half:
    """One machine's half of a WAN link between machines."""

    link: int  # index in topo.links
    here: str  # the DC on this machine
    peer: str  # the DC on the other machine
    peer_machine: str
    local_address: str
    remote_address: str
    vni: int
    tunnel_ip: str  # this half's address on the tunnel (a /30)
    peer_tunnel_ip: str


@dataclass(frozen=True)
class Part:
    """What one machine builds."""

    machine: Machine
    dcs: tuple[str, ...]
    links: tuple[int, ...]  # WAN links whose both DCs are here, built whole
    halves: tuple[Half, ...]


@dataclass(frozen=True)
class ClusterPlan:
    dc_machine: dict[str, str]
    parts: dict[str, Part]  # machine name -> its part (machines with nothing placed are left out)

    def machine_of_node(self, node: str, prefix: str) -> str:
        """The machine whose namespaces include `node` (a host, gateway or WAN namespace name)."""
        for dc, m in self.dc_machine.items():
            if node.startswith(f"{prefix}-{dc}-"):
                return m
        raise KeyError(node)


def tunnel_ips(link: int) -> tuple[str, str]:
    """The two halves' addresses on link k's tunnel: 10.81.k.8/30 (.9 the first DC's side, .10 the second's),
    next to the single-machine WAN namespace's two /30s (testbed/emu/names.py)."""
    return f"10.81.{link}.9", f"10.81.{link}.10"


def assign(topo: Topology, machines: list[Machine], placement: dict[str, str]) -> dict[str, str]:
    """DC -> machine name: the spec's placement, the other DCs round-robin over the machines in order."""
    if not machines:
        raise SpecError("cluster.machines", "no machines", "list machines, or start Ray on the machines first")
    names = [m.name for m in machines]
    dcs = [d.name for d in topo.dcs]
    for dc, m in placement.items():
        if dc not in dcs:
            raise SpecError(f"cluster.placement.{dc}", f"topology {topo.name} has no DC {dc!r}",
                            f"use one of {', '.join(dcs)}")
        if m not in names:
            raise SpecError(f"cluster.placement.{dc}", f"no machine {m!r}", f"use one of {', '.join(names)}")
    out, i = {}, 0
    for dc in dcs:
        if dc in placement:
            out[dc] = placement[dc]
        else:
            out[dc] = names[i % len(names)]
            i += 1
    return out


def plan_cluster(topo: Topology, cluster: Cluster, machines: list[Machine] | None = None) -> ClusterPlan:
    """Each machine's part of the topology. `machines`: the cluster's (default: the spec's list)."""
    machines = list(machines if machines is not None else cluster.machines)
    if cluster.tunnel != "vxlan":
        raise SpecError("cluster.tunnel", f"{cluster.tunnel} tunnels are not yet supported", "use tunnel: vxlan")
    if len(topo.links) > 250:
        raise SpecError("topology", "more than 250 WAN links cannot be tunnelled", "emulate a smaller topology")
    dc_machine = assign(topo, machines, cluster.placement)
    by_name = {m.name: m for m in machines}
    parts: dict[str, Part] = {}
    for m in machines:
        dcs = tuple(dc for dc, name in dc_machine.items() if name == m.name)
        if not dcs:
            continue
        links, halves = [], []
        for k, link in enumerate(topo.links):
            a, b = link.between
            ma, mb = dc_machine[a], dc_machine[b]
            if ma == mb == m.name:
                links.append(k)
            elif m.name in (ma, mb):
                ip_a, ip_b = tunnel_ips(k)
                here, peer = (a, b) if ma == m.name else (b, a)
                mine, theirs = (ip_a, ip_b) if here == a else (ip_b, ip_a)
                other = by_name[mb if ma == m.name else ma]
                halves.append(Half(k, here, peer, other.name, m.address, other.address, cluster.vni_base + k,
                                   mine, theirs))
        parts[m.name] = Part(m, dcs, tuple(links), tuple(halves))
    return ClusterPlan(dc_machine, parts)


def underlay_mtu_needed(link_mtu: int) -> int:
    """The cluster network's MTU a tunnel needs for a link whose hosts send `link_mtu`-byte IP packets."""
    return link_mtu + VXLAN_OVERHEAD_BYTES


def underlay_bps(link_bps: float, link_mtu: int) -> float:
    """What a tunnel carrying a full link puts on the cluster network (bits/s, IP packets counted as an MTU
    counts them): the shaper's frames (IP packet + Ethernet header) and VXLAN's encapsulation per packet."""
    return link_bps * (link_mtu + VXLAN_OVERHEAD_BYTES) / (link_mtu + ETHERNET_HEADER_BYTES)

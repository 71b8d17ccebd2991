"""Names and addresses of an emulated topology. Pure: no side effects, unit-tested.

Everything the testbed creates carries a prefix `gdtb<id>` (geo-distributed testbed), so
`testbed clean` can remove exactly what is ours and nothing else. All interfaces live inside our
own namespaces; the root namespace is never touched by the netns backend.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from testbed.errors import SpecError
from testbed.spec.topology import Topology

PREFIX_RE = re.compile(r"^gdtb[a-z0-9]{1,4}$")
OURS_RE = re.compile(r"^gdtb[a-z0-9]{1,4}-")
DEFAULT_PREFIX = "gdtb0"
LAN_NET = "10.80"  # DC i: 10.80.i.0/24; host j = .j+1, gateway = .254
WAN_NET = "10.81"  # link k: 10.81.k.0/30 (gw_a .1, wan .2) and 10.81.k.4/30 (gw_b .5, wan .6)


def check_prefix(prefix: str) -> str:
    if not PREFIX_RE.match(prefix):
        raise SpecError("--prefix", f"{prefix!r} is not a testbed prefix", "use gdtb followed by 1-4 letters/digits")
    return prefix


@dataclass(frozen=True)
class HostAddr:
    dc: str
    index: int
    ns: str
    ip: str


@dataclass(frozen=True)
class WanAddr:
    index: int
    a: str
    b: str
    ns: str
    gw_a_ip: str
    wan_a_ip: str
    gw_b_ip: str
    wan_b_ip: str


@dataclass(frozen=True)
class AddressPlan:
    prefix: str
    hosts: list[HostAddr]
    gateways: dict[str, tuple[str, str]]  # dc -> (ns, lan ip)
    wans: list[WanAddr]
    lan_subnet: dict[str, str]

    def host(self, name: str) -> HostAddr:
        for h in self.hosts:
            if host_name(h) == name:
                return h
        raise SpecError("host", f"unknown host {name!r}", f"use one of {', '.join(host_name(h) for h in self.hosts)}")

    def wan(self, a: str, b: str) -> WanAddr:
        for w in self.wans:
            if {w.a, w.b} == {a, b}:
                return w
        raise KeyError((a, b))


def host_name(h: HostAddr) -> str:
    return f"{h.dc}-h{h.index}"


def address_plan(topo: Topology, prefix: str = DEFAULT_PREFIX) -> AddressPlan:
    check_prefix(prefix)
    if len(topo.dcs) > 250 or len(topo.links) > 250:
        raise SpecError("topology", "more than 250 DCs or links cannot be emulated", "emulate a smaller topology")
    hosts, gws, subnets = [], {}, {}
    for i, dc in enumerate(topo.dcs):
        subnets[dc.name] = f"{LAN_NET}.{i}.0/24"
        gws[dc.name] = (f"{prefix}-{dc.name}-gw", f"{LAN_NET}.{i}.254")
        for j in range(dc.hosts):
            hosts.append(HostAddr(dc.name, j, f"{prefix}-{dc.name}-h{j}", f"{LAN_NET}.{i}.{j + 1}"))
    wans = []
    for k, link in enumerate(topo.links):
        a, b = link.between
        base = ipaddress.ip_address(f"{WAN_NET}.{k}.0")
        wans.append(WanAddr(k, a, b, f"{prefix}-wan-{a}-{b}", str(base + 1), str(base + 2), str(base + 5),
                            str(base + 6)))
    return AddressPlan(prefix, hosts, gws, wans, subnets)

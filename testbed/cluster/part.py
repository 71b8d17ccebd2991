"""One machine's part of a cluster emulation, built with the single-machine builder (testbed/emu/build.py): its
DCs, the WAN links between them, and its half of every link to a DC on another machine.

A half is the link's WAN namespace as on one machine, except that its side towards the peer DC is a VXLAN
device to the peer's machine (made in the machine's own namespace, whose UDP socket it keeps, then moved into the
WAN namespace under the peer DC's name). The half shapes (HTB) and delays what it sends into the tunnel, so each
direction is shaped and delayed once, at its sending end, by the same commands as a local link's egress.
"""

from __future__ import annotations

from pathlib import Path

from testbed.cluster.placement import Half, Part, underlay_mtu_needed
from testbed.emu.build import (
    MTU,
    Emulation,
    build_dc,
    build_wan,
    ever_delayed,
    prepare_machine,
    shape_egress,
    start_delayline,
)
from testbed.emu.sh import EmuError, run


def builder(part: Part, vxlan_port: int):
    """The `builder` for testbed/emu/build.py `up` that builds `part` on this machine."""

    def build(emu: Emulation) -> None:
        if emu.backend.name != "netns":
            raise EmuError(f"a cluster emulation runs on the netns backend; {emu.backend.name} is not yet supported")
        prepare_machine(emu)
        index = {dc.name: i for i, dc in enumerate(emu.topo.dcs)}
        gws = {dc: build_dc(emu, index[dc], dc) for dc in part.dcs}
        for k in part.links:
            build_wan(emu, emu.addr.wans[k], emu.net.links[k], gws)
        for half in part.halves:
            build_half(emu, half, gws, vxlan_port)
        emu.backend.start()

    return build


def underlay_mtu(remote: str) -> tuple[str, int]:
    """The device this machine reaches `remote` through, and its MTU."""
    words = run(["ip", "-o", "route", "get", remote]).split()
    dev = words[words.index("dev") + 1]
    return dev, int(Path(f"/sys/class/net/{dev}/mtu").read_text())


def check_underlay(half: Half, link_mtu: int) -> None:
    dev, mtu = underlay_mtu(half.remote_address)
    need = underlay_mtu_needed(link_mtu)
    if mtu < need:
        raise EmuError(f"{half.here}-{half.peer}: the cluster network's MTU towards {half.peer_machine} "
                       f"({half.remote_address}, dev {dev}) is {mtu}; the tunnel needs {need} ({link_mtu}-byte "
                       f"packets + {need - link_mtu} of VXLAN): raise it (ip link set dev {dev} mtu {need}); "
                       f"smaller packets are not yet supported")


def build_half(emu: Emulation, half: Half, gws: dict, vxlan_port: int) -> None:
    """This machine's half of the WAN link `half.link`: gateway <-> WAN namespace <-> tunnel to the peer."""
    be, w, link = emu.backend, emu.addr.wans[half.link], emu.net.links[half.link]
    check_underlay(half, emu.mtu(half.here, half.peer))
    wan = be.add_node(w.ns, "wan")
    emu.save()
    be.run(wan, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    gw_ip, wan_ip = (w.gw_a_ip, w.wan_a_ip) if half.here == w.a else (w.gw_b_ip, w.wan_b_ip)
    be.link(gws[half.here], f"w-{half.peer}", wan, half.here, MTU)
    be.run(gws[half.here], ["ip", "addr", "add", f"{gw_ip}/30", "dev", f"w-{half.peer}"])
    be.run(wan, ["ip", "addr", "add", f"{wan_ip}/30", "dev", half.here])
    be.run(gws[half.here], ["ip", "route", "add", emu.addr.lan_subnet[half.peer], "via", wan_ip])
    be.run(wan, ["ip", "route", "add", emu.addr.lan_subnet[half.here], "via", gw_ip])
    tmp = f"{emu.prefix}-vx{half.link}"  # in this machine's namespace until moved: `testbed clean` knows the name
    run(["ip", "link", "add", tmp, "mtu", str(MTU), "type", "vxlan", "id", str(half.vni), "local",
         half.local_address, "remote", half.remote_address, "dstport", str(vxlan_port)])
    run(["ip", "link", "set", "dev", tmp, "netns", wan.ns])  # type: ignore[list-item]
    be.run(wan, ["ip", "link", "set", "dev", tmp, "name", half.peer])
    be.run(wan, ["ip", "link", "set", "dev", half.peer, "up"])
    be.run(wan, ["ip", "addr", "add", f"{half.tunnel_ip}/30", "dev", half.peer])
    be.run(wan, ["ip", "route", "add", emu.addr.lan_subnet[half.peer], "via", half.peer_tunnel_ip])
    shape_egress(emu, wan, half.peer, link)
    if emu.delay == "nfqueue" and ever_delayed(link):
        start_delayline(emu, wan, half.here, half.peer, emu.link(*link.between).delay_ms, both=False)

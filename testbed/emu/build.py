"""Topology spec -> a running emulated network, on any backend.

Per DC: a gateway node holding the DC bridge (br0) and one node per emulated host on it.
Per WAN link: a WAN node between the two gateways that shapes each direction (HTB) and delays it
(netem, or our NFQUEUE delay line). MTU 9000 on every interface (the delay line's cost is per packet); a host
reaches each peer DC at its link's packet size (runtime/htb.py link_mtu), which is 9000 from 200 Mbit/s up.
`scale` k divides link rates and TCP window caps (transfer times stay real-world); latencies stay.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.emu import owner, state
from testbed.emu.backends import Backend, Node, make_backend
from testbed.emu.kernel import delay_method, require_root
from testbed.emu.names import AddressPlan, WanAddr, address_plan, host_name
from testbed.emu.rungroup import run_gid, secure_dir
from testbed.emu.scale import FOREIGN_SHARE, MAX_LAN_BPS, check_scale, receive_buffer, window_notes  # noqa: F401
from testbed.emu.sh import EmuError
from testbed.emu.shaping import htb_commands, lan_commands
from testbed.net.links import NetLink, NetPlan
from testbed.net.scale import MIN_WINDOW, MSS, MTU, TCP_HEADERS, EmulatedLink, emulated_window, link_mss  # noqa: F401
from testbed.net.units import gbps_to_bps
from testbed.net.wire import GSO_SEGMENTS
from testbed.plan.network import lower_network
from testbed.runtime.cpuclass import check_mode
from testbed.spec.experiment import warm_windows as default_warm_windows
from testbed.spec.topology import Topology


@dataclass
class Emulation:
    prefix: str
    topo: Topology
    backend: Backend
    addr: AddressPlan
    scale: float
    delay: str  # netem | nfqueue | none
    notes: list[str] = field(default_factory=list)
    delaylines: dict[str, subprocess.Popen] = field(default_factory=dict)
    lan_gpus_per_host: int = 1  # GPUs whose NICs one emulated host stands for (a training run sets tp)
    # TCP's congestion-window restart after an idle RTO (net.ipv4.tcp_slow_start_after_idle), set on every host
    slow_start_after_idle: bool = False
    # connections start with their window open (a route per peer DC with its initcwnd: `initial_windows`); off where
    # slow start after idle is on, whose restart would otherwise be to the same window
    warm_windows: bool = True
    congestion_control: str = "cubic"  # net.ipv4.tcp_congestion_control on every host
    user_timeout_s: float = 30.0  # TCP_USER_TIMEOUT of the workers' connections (network.tcp_user_timeout_s)
    claimed: bool = False  # `up` made this process the prefix's owner, so `down` gives it back
    realtime: str = "auto"  # emulation.realtime: the CPU class of delay lines, sidecars, workers (runtime/cpuclass.py)
    net: NetPlan = None  # type: ignore[assignment]  # the WAN links as built: lower_network(topo, scale)

    def __post_init__(self) -> None:
        if self.net is None:
            self.net = lower_network(self.topo, self.scale)

    def link(self, a: str, b: str) -> EmulatedLink:
        """The WAN link between DCs a and b as built (emulated units; testbed/net/scale.py applies k)."""
        return self.net.emulated(a, b)

    def node(self, name: str) -> Node:
        return self.backend.nodes[name]

    def host_node(self, host: str) -> Node:
        return self.node(self.addr.host(host).ns)

    def window_bytes(self, a: str, b: str) -> int:
        """One emulated connection's window between DCs a and b."""
        return self.link(a, b).window_bytes

    def link_bps(self, a: str, b: str) -> float:
        """The emulated rate (bits/s) of the link between DCs a and b."""
        return self.link(a, b).rate_bps

    def mtu(self, a: str, b: str) -> int:
        """The packet size between DCs a and b (the hosts' route to the peer DC: net/wire.py link_mtu), from the
        rate the link was built at: a link that changes keeps its hosts' routes, and its HTB classes their quantum."""
        return self.link(a, b).mtu

    def mss(self, a: str, b: str) -> int:
        """TCP payload per packet between DCs a and b."""
        return self.link(a, b).mss

    def lan_rate_bps(self, dc: str) -> float | None:
        """Shaped rate of a host's link into its DC (None: unshaped, when the scaled fabric exceeds
        what a veth carries here, about 2 Gbit/s)."""
        d = self.topo.dc(dc)
        rate = gbps_to_bps(d.intra_gbps) * self.lan_gpus_per_host / self.scale
        return rate if rate <= MAX_LAN_BPS else None

    def host_window(self, dc: str) -> int:
        """A host's receive window cap: the largest of its DC's WAN links (a sysctl is per host, not per peer)."""
        return max((self.window_bytes(dc, peer) for peer, _ in self.net.touching(dc)), default=MIN_WINDOW)

    def state(self) -> dict:
        return {
            "prefix": self.prefix, "backend": self.backend.name, "scale": self.scale, "delay": self.delay,
            "realtime": self.realtime,
            "topology": self.topo.model_dump(mode="json"), "notes": self.notes,
            "namespaces": [n.ns for n in self.backend.nodes.values() if n.ns],
            "pids": {k: p.pid for k, p in self.delaylines.items()},
            "created": time.time(),
        }

    def save(self) -> None:
        state.save(self.prefix, self.state())


def up(topo: Topology, *, backend: str = "netns", prefix: str | None = "gdtb0", scale: float = 1.0,
       delay: str = "auto", lan_gpus_per_host: int = 1, slow_start_after_idle: bool = False,
       congestion_control: str = "cubic", mounts: list[str] | None = None, warm_windows: bool | None = None,
       user_timeout_s: float = 30.0, builder: Callable[[Emulation], None] | None = None,
       realtime: str = "auto") -> Emulation:
    """Build the topology (prefix None: the first free gdtb<N>). On any failure (or Ctrl-C) everything
    built so far is removed. `mounts`: host folders the container backends bind-mount at the same path in
    every host container. `builder`: what of the topology this machine builds (default all of it; a cluster
    machine its part: testbed/cluster/part.py). `realtime`: the CPU class of the run's time-critical processes
    (auto|on|off: testbed/runtime/cpuclass.py)."""
    check_scale(topo, scale, lan_gpus_per_host=lan_gpus_per_host)  # before anything exists
    require_root()
    if prefix is None:
        from testbed.emu.clean import our_namespaces

        prefix, claimed = owner.pick_free(set(our_namespaces())), True
    else:
        address_plan(topo, prefix)  # a bad prefix or topology fails before anything is claimed
        if state.load(prefix) is not None:
            raise EmuError(f"a topology with prefix {prefix} is already up; `testbed topology down --prefix "
                           f"{prefix}` or pick another --prefix")
        claimed = owner.claim(prefix)  # refuses a prefix another live run holds
    addr = address_plan(topo, prefix)
    try:
        method = delay_method(delay)
        be = make_backend(backend, prefix)
        be.mounts = list(mounts or [])
        emu = Emulation(prefix, topo, be, addr, scale, method, window_notes(topo, scale),
                        lan_gpus_per_host=lan_gpus_per_host, slow_start_after_idle=slow_start_after_idle,
                        warm_windows=(default_warm_windows("auto", slow_start_after_idle) if warm_windows is None
                                      else warm_windows),
                        congestion_control=congestion_control, user_timeout_s=user_timeout_s, claimed=claimed,
                        realtime=check_mode(realtime))
        secure_dir(state.run_dir(prefix), run_gid(emu.backend))  # 0750, the run's group: its sockets live here
    except BaseException:
        if claimed:
            owner.release(prefix)
        raise
    emu.save()
    try:
        (builder or _build)(emu)
        emu.save()
    except BaseException:
        down(emu)
        raise
    return emu


def allow_receive_buffer(nbytes: int) -> None:
    """The workers' SO_RCVBUF is capped by net.core.rmem_max, which is the machine's (not a namespace's): raise it
    to `nbytes` if it is lower (never lowers it)."""
    from pathlib import Path

    path = Path("/proc/sys/net/core/rmem_max")
    if int(path.read_text()) < nbytes:
        path.write_text(str(nbytes))


def allow_congestion_control(name: str) -> None:
    """A namespace may only pick a congestion control the root namespace allows: add `name` to
    net.ipv4.tcp_allowed_congestion_control if the kernel has it (additive: no default changes)."""
    from pathlib import Path

    proc = Path("/proc/sys/net/ipv4")
    available = (proc / "tcp_available_congestion_control").read_text().split()
    if name not in available:
        raise EmuError(f"this kernel has no {name} congestion control (it has {', '.join(available)}); "
                       f"set network.tcp_congestion_control to one of those")
    allowed = (proc / "tcp_allowed_congestion_control").read_text().split()
    if name not in allowed:
        (proc / "tcp_allowed_congestion_control").write_text(" ".join([*allowed, name]))


def host_sysctls(emu: Emulation, dc: str) -> list[str]:
    """TCP settings of a DC's hosts: every setting a run's timing depends on, set explicitly, so results do
    not depend on the machine's defaults (this one's default congestion control is BBR)."""
    rmem = receive_buffer(emu.host_window(dc))
    # the send buffer holds unacknowledged data in skbs (about 5 % more than their bytes): room for the window
    # several times over; autotuning grows it from 64 KiB as the congestion window opens (inherited defaults vary)
    return [f"net.ipv4.tcp_rmem=4096 {min(131072, rmem)} {rmem}", "net.ipv4.tcp_moderate_rcvbuf=1",
            f"net.ipv4.tcp_wmem=4096 65536 {max(4 * rmem, 4 * 2**20)}",
            f"net.ipv4.tcp_slow_start_after_idle={int(emu.slow_start_after_idle)}",
            f"net.ipv4.tcp_congestion_control={emu.congestion_control}",
            "net.ipv4.tcp_no_metrics_save=1"]  # no ssthresh carried from one run's connections to the next


LINUX_INITIAL_CWND = 10  # segments (TCP_INIT_CWND): a window smaller than this keeps Linux's


def initial_windows(emu: Emulation, dc: str) -> dict[str, int]:
    """Peer DC -> the initial congestion window (segments) of a connection from `dc`'s hosts across their WAN link,
    given by a route per peer (`initcwnd`): with `warm_windows`, the link's window, or its bandwidth-delay product
    where that is smaller, so a connection sends that much from its first round trip, as the simulator's
    window-bound model has it from the start (and a long-running job's connections are after warm-up). With
    Linux's 10 segments, HyStart left slow start early in the queues the windows build, and cubic took 2-4
    iterations to open the windows (seed 31 topology 1: those iterations ran 5-8 % faster than the steady ones,
    docs/fidelity.md). Never more than the product: a burst of whole 16 MiB windows from four connections
    overflowed a 32 MiB queue."""
    if not emu.warm_windows:
        return {}
    out = {}
    for peer, _ in emu.net.touching(dc):
        e = emu.link(dc, peer)
        cwnd = min(e.window_bytes, e.capacity_bytes_s * e.rtt_s)
        out[peer] = max(LINUX_INITIAL_CWND, math.ceil(cwnd / e.mss))
    return out


def peer_routes(emu: Emulation, dc: str) -> dict[str, list[str]]:
    """Peer DC -> the options of a `dc` host's route to it: the link's packet size (`mtu lock`, runtime/htb.py
    link_mtu), an acknowledgement for every packet (`quickack 1`) and, with warm windows, the initial congestion
    window (`initial_windows`).

    Quick acknowledgements: a receiver delays the acknowledgement of a lone segment up to its delayed-ACK timer
    (40 ms and more), and an emulated window is a handful of segments (64 KiB is nine of a 7.4 KB path, where a
    real window of the same time is thousands of 1.4-9 KB segments). With an odd number of segments a round, its
    last segment's acknowledgement came 40-46 ms late in every round trip, and held a ninth of the window
    (seed 241 topology 7: -8.5 %, docs/fidelity.md "Delayed acknowledgements"). A real window's delayed last
    segment is a thousandth of it; quick acks remove what only scaling made large."""
    cwnds = initial_windows(emu, dc)
    out = {}
    for peer, _ in emu.net.touching(dc):
        route = ["mtu", "lock", str(emu.mtu(dc, peer)), "quickack", "1"]
        if peer in cwnds:
            route += ["initcwnd", str(cwnds[peer])]
        out[peer] = route
    return out


def _build(emu: Emulation) -> None:
    prepare_machine(emu)
    gws = {dc.name: build_dc(emu, i, dc.name) for i, dc in enumerate(emu.topo.dcs)}
    for w, link in zip(emu.addr.wans, emu.net.links, strict=True):
        build_wan(emu, w, link, gws)
    emu.backend.start()


def prepare_machine(emu: Emulation) -> None:
    """The machine-wide settings a build needs: its congestion control allowed, its receive buffers' cap."""
    allow_congestion_control(emu.congestion_control)
    from testbed.runtime.worker import socket_buffer

    allow_receive_buffer(socket_buffer(max((link.emulated.window_bytes for link in emu.net.links  # type: ignore[union-attr]
                                            ), default=0)))


def build_dc(emu: Emulation, i: int, dc: str) -> Node:
    """DC `dc` (the i-th): its gateway, its hosts on the gateway's LAN, their routes and TCP settings; returns
    the gateway."""
    be, addr = emu.backend, emu.addr
    gw_ns, gw_ip = addr.gateways[dc]
    gw = be.add_node(gw_ns, "gateway")
    hosts = [h for h in addr.hosts if h.dc == dc]
    nodes = [be.add_node(h.ns, "host") for h in hosts]
    emu.save()
    lan = be.attach_lan(i, gw, nodes, MTU)
    be.run(gw, ["ip", "addr", "add", f"{gw_ip}/24", "dev", lan])
    be.run(gw, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    lan_bps = emu.lan_rate_bps(dc)
    for h, node in zip(hosts, nodes, strict=True):
        be.run(node, ["ip", "addr", "add", f"{h.ip}/24", "dev", "eth0"])
        be.run(node, ["ip", "route", "add", "default", "via", gw_ip])
        # no TSO/GSO packet larger than HTB's quantum (runtime/htb.py link_quantum): turns stay byte-fair
        be.run(node, ["ip", "link", "set", "dev", "eth0", "gso_max_segs", str(GSO_SEGMENTS)])
        for peer, route in peer_routes(emu, dc).items():
            be.run(node, ["ip", "route", "add", addr.lan_subnet[peer], "via", gw_ip, *route])
        for setting in host_sysctls(emu, dc):
            be.run(node, ["sysctl", "-qw", setting])
        if lan_bps is not None:  # the host's NIC into the DC fabric: a TP group's NICs, scaled
            for cmd in lan_commands("eth0", lan_bps):
                be.run(node, cmd)
    return gw


def build_wan(emu: Emulation, w: WanAddr, link: NetLink, gws: dict[str, Node]) -> None:
    """A WAN link whose two DCs are both here: its WAN node between the gateways, each direction shaped on its
    way out and delayed."""
    be = emu.backend
    wan = be.add_node(w.ns, "wan")
    emu.save()
    be.run(wan, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    for dc, peer, gw_ip, wan_ip in ((w.a, w.b, w.gw_a_ip, w.wan_a_ip), (w.b, w.a, w.gw_b_ip, w.wan_b_ip)):
        gw = gws[dc]
        be.link(gw, f"w-{peer}", wan, dc, MTU)
        be.run(gw, ["ip", "addr", "add", f"{gw_ip}/30", "dev", f"w-{peer}"])
        be.run(wan, ["ip", "addr", "add", f"{wan_ip}/30", "dev", dc])
        be.run(gw, ["ip", "route", "add", emu.addr.lan_subnet[peer], "via", wan_ip])
        be.run(wan, ["ip", "route", "add", emu.addr.lan_subnet[dc], "via", gw_ip])
    for dev in (w.a, w.b):  # egress towards that DC
        shape_egress(emu, wan, dev, link)
    e = emu.link(w.a, w.b)
    if emu.delay == "nfqueue" and ever_delayed(link):
        start_delayline(emu, wan, w.a, w.b, e.delay_ms)


def ever_delayed(link: NetLink) -> bool:
    """Whether a link needs a delay line: it has a latency now or its schedule gives it one later."""
    return max([link.latency_s, *(st.latency_s for _, st in link.changes)]) > 0


def shape_egress(emu: Emulation, wan: Node, dev: str, link: NetLink) -> None:
    """HTB at the link's emulated rate (and netem's delay, where the kernel has it) on `dev`'s way out."""
    e = emu.link(*link.between)
    netem = e.delay_ms if emu.delay == "netem" else None
    for cmd in htb_commands(dev, e.rate_bps, e.rtt_s, netem, e.mtu):
        emu.backend.run(wan, cmd)


def start_delayline(emu: Emulation, wan: Node, a: str, b: str, latency_ms: float, both: bool = True) -> None:
    """One delay-line process per WAN node, bound before the iptables rules that feed it exist: queue 0 delays
    a -> b, queue 1 b -> a (`both` False: only a -> b, the half of a link that sends into a tunnel)."""
    be = emu.backend
    stats = state.run_dir(emu.prefix) / f"{wan.name}.delay.json"
    log = open(state.run_dir(emu.prefix) / f"{wan.name}.delay.log", "w")  # noqa: SIM115 (owned by the child)
    args = ["--stats-file", str(stats), "--control", delay_control(emu, wan.name), "--realtime", emu.realtime,
            f"0:{latency_ms}", f"1:{latency_ms}"]
    p = be.spawn(wan, "testbed.emu.delayline", args,
                 stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    emu.delaylines[wan.name] = p
    emu.save()
    line = _readline(p, 15.0)
    if line != "ready":
        raise EmuError(f"delay line in {wan.name} did not start: {line or 'no output'} (see {log.name})")
    for qnum, (src, dst) in enumerate(((a, b), (b, a)) if both else ((a, b),)):
        be.run(wan, ["iptables", "-t", "mangle", "-A", "FORWARD", "-i", src, "-o", dst, "-j", "NFQUEUE",
                     "--queue-num", str(qnum)])


def delay_control(emu: Emulation, wan: str) -> str:
    """The delay line's control socket in WAN node `wan` (its delays change live: testbed/emu/wanchange.py)."""
    return str(state.run_dir(emu.prefix) / f"{wan}.delay.sock")


def _readline(p: subprocess.Popen, timeout: float) -> str:
    import select

    r, _, _ = select.select([p.stdout], [], [], timeout)
    return p.stdout.readline().strip() if r else ""  # type: ignore[union-attr]


def down(emu: Emulation) -> None:
    """Stop our processes, then remove every node; forget the state."""
    for p in emu.delaylines.values():
        with contextlib.suppress(ProcessLookupError):
            p.terminate()
    for p in emu.delaylines.values():
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    emu.backend.teardown()
    state.forget(emu.prefix)
    if emu.claimed:
        owner.release(emu.prefix)


def host_names(emu: Emulation) -> list[str]:
    return [host_name(h) for h in emu.addr.hosts]

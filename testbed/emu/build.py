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
from dataclasses import dataclass, field

from testbed.emu import owner, state
from testbed.emu.backends import Backend, Node, make_backend
from testbed.emu.kernel import delay_method, require_root
from testbed.emu.names import AddressPlan, address_plan, host_name
from testbed.emu.rungroup import run_gid, secure_dir
from testbed.emu.scale import (  # noqa: F401
    FOREIGN_SHARE,
    MAX_LAN_BPS,
    MIN_WINDOW,
    MSS,
    MTU,
    TCP_HEADERS,
    check_scale,
    emulated_window,
    receive_buffer,
)
from testbed.emu.sh import EmuError
from testbed.emu.shaping import htb_commands, lan_commands
from testbed.runtime.htb import GSO_SEGMENTS, link_mtu
from testbed.spec.experiment import warm_windows as default_warm_windows
from testbed.spec.topology import Topology


def link_mss(link_bps: float) -> int:
    """TCP payload per packet on an emulated WAN path whose link carries `link_bps` (bits/s)."""
    return link_mtu(link_bps) - TCP_HEADERS


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
    claimed: bool = False  # `up` made this process the prefix's owner, so `down` gives it back

    def node(self, name: str) -> Node:
        return self.backend.nodes[name]

    def host_node(self, host: str) -> Node:
        return self.node(self.addr.host(host).ns)

    def window_bytes(self, a: str, b: str) -> int:
        link = self.topo.link(a, b)
        return emulated_window(self.topo.window_mb(link) * 2**20, self.scale,  # type: ignore[arg-type]
                               self.mss(a, b))

    def link_bps(self, a: str, b: str) -> float:
        """The emulated rate (bits/s) of the link between DCs a and b."""
        return self.topo.link(a, b).gbps * 1e9 / self.scale  # type: ignore[union-attr]

    def mtu(self, a: str, b: str) -> int:
        """The packet size between DCs a and b (the hosts' route to the peer DC: runtime/htb.py link_mtu), from the
        rate the link was built at: a link that changes keeps its hosts' routes, and its HTB classes their quantum."""
        return link_mtu(self.link_bps(a, b))

    def mss(self, a: str, b: str) -> int:
        """TCP payload per packet between DCs a and b."""
        return link_mss(self.link_bps(a, b))

    def lan_rate_bps(self, dc: str) -> float | None:
        """Shaped rate of a host's link into its DC (None: unshaped, when the scaled fabric exceeds
        what a veth carries here, about 2 Gbit/s)."""
        d = self.topo.dc(dc)
        rate = d.intra_gbps * 1e9 * self.lan_gpus_per_host / self.scale
        return rate if rate <= MAX_LAN_BPS else None

    def host_window(self, dc: str) -> int:
        """A host's receive window cap: the largest of its DC's WAN links (a sysctl is per host, not per peer)."""
        return max((self.window_bytes(*link.between) for link in self.topo.links if dc in link.between),
                   default=MIN_WINDOW)

    def state(self) -> dict:
        return {
            "prefix": self.prefix, "backend": self.backend.name, "scale": self.scale, "delay": self.delay,
            "topology": self.topo.model_dump(mode="json"), "notes": self.notes,
            "namespaces": [n.ns for n in self.backend.nodes.values() if n.ns],
            "pids": {k: p.pid for k, p in self.delaylines.items()},
            "created": time.time(),
        }

    def save(self) -> None:
        state.save(self.prefix, self.state())


def window_notes(topo: Topology, scale: float) -> list[str]:
    notes = []
    for dc in topo.dcs:
        wins = {topo.window_mb(link) for link in topo.links if dc.name in link.between}
        if len(wins) > 1:
            notes.append(f"{dc.name}: its links have different TCP windows {sorted(wins)} MiB; training workers clamp "
                         f"each connection to its link's, other processes (testbed launch) get the kernel's window "
                         f"for a receive buffer sized for the largest (a buffer is per host)")
    for link in topo.links:
        w = topo.window_mb(link) * 2**20 / scale
        if w < MIN_WINDOW:
            a, b = link.between
            notes.append(f"{a}-{b}: window {topo.window_mb(link):g} MiB / scale {scale:g} = {w / 1024:.1f} KiB is "
                         f"below 64 KiB; emulated with 64 KiB, so one connection carries "
                         f"{MIN_WINDOW / w:.1f}x more than the scaled real-world one")
    return notes


def up(topo: Topology, *, backend: str = "netns", prefix: str | None = "gdtb0", scale: float = 1.0,
       delay: str = "auto", lan_gpus_per_host: int = 1, slow_start_after_idle: bool = False,
       congestion_control: str = "cubic", mounts: list[str] | None = None, warm_windows: bool | None = None
       ) -> Emulation:
    """Build the topology (prefix None: the first free gdtb<N>). On any failure (or Ctrl-C) everything
    built so far is removed. `mounts`: host folders the container backends bind-mount at the same path in
    every host container."""
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
                        congestion_control=congestion_control, claimed=claimed)
        secure_dir(state.run_dir(prefix), run_gid(emu.backend))  # 0750, the run's group: its sockets live here
    except BaseException:
        if claimed:
            owner.release(prefix)
        raise
    emu.save()
    try:
        _build(emu)
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
    for link in emu.topo.links:
        if dc not in link.between:
            continue
        peer = link.between[1] if link.between[0] == dc else link.between[0]
        bdp = emu.link_bps(dc, peer) / 8 * 2 * link.latency_ms / 1e3
        cwnd = min(emu.window_bytes(dc, peer), bdp)
        out[peer] = max(LINUX_INITIAL_CWND, math.ceil(cwnd / emu.mss(dc, peer)))
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
    for link in emu.topo.links:
        if dc not in link.between:
            continue
        peer = link.between[1] if link.between[0] == dc else link.between[0]
        route = ["mtu", "lock", str(emu.mtu(dc, peer)), "quickack", "1"]
        if peer in cwnds:
            route += ["initcwnd", str(cwnds[peer])]
        out[peer] = route
    return out


def _build(emu: Emulation) -> None:
    be, topo, addr = emu.backend, emu.topo, emu.addr
    allow_congestion_control(emu.congestion_control)
    from testbed.runtime.worker import socket_buffer

    allow_receive_buffer(socket_buffer(max((emu.window_bytes(*link.between) for link in topo.links), default=0)))
    gws: dict[str, Node] = {}
    for i, dc in enumerate(topo.dcs):
        gw_ns, gw_ip = addr.gateways[dc.name]
        gw = gws[dc.name] = be.add_node(gw_ns, "gateway")
        hosts = [h for h in addr.hosts if h.dc == dc.name]
        nodes = [be.add_node(h.ns, "host") for h in hosts]
        emu.save()
        lan = be.attach_lan(i, gw, nodes, MTU)
        be.run(gw, ["ip", "addr", "add", f"{gw_ip}/24", "dev", lan])
        be.run(gw, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        lan_bps = emu.lan_rate_bps(dc.name)
        for h, node in zip(hosts, nodes, strict=True):
            be.run(node, ["ip", "addr", "add", f"{h.ip}/24", "dev", "eth0"])
            be.run(node, ["ip", "route", "add", "default", "via", gw_ip])
            # no TSO/GSO packet larger than HTB's quantum (runtime/htb.py link_quantum): turns stay byte-fair
            be.run(node, ["ip", "link", "set", "dev", "eth0", "gso_max_segs", str(GSO_SEGMENTS)])
            for peer, route in peer_routes(emu, dc.name).items():
                be.run(node, ["ip", "route", "add", addr.lan_subnet[peer], "via", gw_ip, *route])
            for setting in host_sysctls(emu, dc.name):
                be.run(node, ["sysctl", "-qw", setting])
            if lan_bps is not None:  # the host's NIC into the DC fabric: a TP group's NICs, scaled
                for cmd in lan_commands("eth0", lan_bps):
                    be.run(node, cmd)
    for w, link in zip(addr.wans, topo.links, strict=True):
        wan = be.add_node(w.ns, "wan")
        emu.save()
        be.run(wan, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        for dc, peer, gw_ip, wan_ip in ((w.a, w.b, w.gw_a_ip, w.wan_a_ip), (w.b, w.a, w.gw_b_ip, w.wan_b_ip)):
            gw = gws[dc]
            be.link(gw, f"w-{peer}", wan, dc, MTU)
            be.run(gw, ["ip", "addr", "add", f"{gw_ip}/30", "dev", f"w-{peer}"])
            be.run(wan, ["ip", "addr", "add", f"{wan_ip}/30", "dev", dc])
            be.run(gw, ["ip", "route", "add", addr.lan_subnet[peer], "via", wan_ip])
            be.run(wan, ["ip", "route", "add", addr.lan_subnet[dc], "via", gw_ip])
        rate = link.gbps * 1e9 / emu.scale
        rtt = 2 * link.latency_ms / 1e3
        netem = link.latency_ms if emu.delay == "netem" else None
        for dev in (w.a, w.b):  # egress towards that DC
            for cmd in htb_commands(dev, rate, rtt, netem, emu.mtu(w.a, w.b)):
                be.run(wan, cmd)
        if emu.delay == "nfqueue" and max([link.latency_ms, *(p.latency_ms for p in link.trace or [])]) > 0:
            start_delayline(emu, wan, w.a, w.b, link.latency_ms)
    be.start()


def start_delayline(emu: Emulation, wan: Node, a: str, b: str, latency_ms: float) -> None:
    """One delay-line process per WAN node, bound before the iptables rules that feed it exist."""
    be = emu.backend
    stats = state.run_dir(emu.prefix) / f"{wan.name}.delay.json"
    log = open(state.run_dir(emu.prefix) / f"{wan.name}.delay.log", "w")  # noqa: SIM115 (owned by the child)
    args = ["--stats-file", str(stats), "--control", delay_control(emu, wan.name), f"0:{latency_ms}", f"1:{latency_ms}"]
    p = be.spawn(wan, "testbed.emu.delayline", args,
                 stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    emu.delaylines[wan.name] = p
    emu.save()
    line = _readline(p, 15.0)
    if line != "ready":
        raise EmuError(f"delay line in {wan.name} did not start: {line or 'no output'} (see {log.name})")
    for qnum, (src, dst) in enumerate(((a, b), (b, a))):
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

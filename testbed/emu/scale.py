"""Choosing the emulation scale factor k (emulated links at 100-200 Mbit/s), and the range of k a
topology can be emulated at: rates, windows and bytes divided by k must stay inside what HTB, the
kernel's TCP buffers and the workers can carry. Checked before anything is built. Applying k to a link:
testbed/net/scale.py."""

from __future__ import annotations

import math

from testbed.costs.tcp import striped_rate
from testbed.errors import SpecError
from testbed.net.scale import MIN_WINDOW, MSS, MTU, TCP_HEADERS, emulated_window  # noqa: F401
from testbed.net.units import bytes_s_to_bps, gbps_to_bps, mib_to_bytes
from testbed.plan.network import covering_connections, lower_network
from testbed.spec.topology import Topology

# Linux advertises the share of a receive buffer that it measures per connection (scaling_ratio: a received
# segment's length over its memory, since kernel 6.6; 1/2 before): 0.75 to 0.95 of the buffer here with MTU
# 9000, varying with the buffer's size, between connections and with how promptly the reader reads
# (docs/fidelity.md). Neither a buffer sized from one share nor a route's `window` metric (the kernel's window
# clamp follows the buffer) gives a connection the spec's window. So the training workers give each WAN
# connection a fixed buffer of twice its window and clamp its window to the plan's (runtime/worker.py); the
# hosts' autotuned buffer, for processes that do not clamp (iperf3, testbed launch), is sized from a share of
# 0.9, which gives them 0.83-1.05 of the window here.
FOREIGN_SHARE = 0.9
MAX_LAN_BPS = 2e9


def receive_buffer(window: int) -> int:
    """A host's largest autotuned TCP receive buffer for a window (what unclamped connections get)."""
    return int(window / FOREIGN_SHARE)


TARGET_MBPS = 200.0
# The Atlas sidecar parks a paused replica's class at 1/100 of the link, and never below flowctl's
# 8 kbit/s floor (MIN_RATE_BPS): below 100 x 8 kbit/s a paused class would get as much as a running one.
MIN_EMULATED_BPS = 100 * 8_000
# A veth pair and HTB carry a few Gbit/s on one core (the LAN is left unshaped above 2 Gbit/s): a link
# scaled beyond this is not emulated at its rate on any machine.
MAX_EMULATED_BPS = 100e9
MAX_SYSCTL_INT = 2**31 - 1  # net.ipv4.tcp_rmem is an int: the receive buffer of a scaled window must fit


def auto_scale(topo: Topology, target_mbps: float = TARGET_MBPS) -> float:
    """The smallest k that brings the fastest WAN link down to `target_mbps` (1 if it already is); a machine with
    little headroom asks for less (testbed/emu/headroom.py)."""
    fastest = max((link.gbps * 1e3 for link in topo.links), default=0.0)
    return max(1.0, fastest / target_mbps)


# --scale auto (testbed launch): the share of the machine's measured ceiling of shaped, delayed traffic
# (testbed.emu.wan_headroom) the emulated WAN may use at once; the rest of the machine is left to the ranks.
HEADROOM_SHARE = 0.5
K_STEPS = (1.0, 2.0, 5.0)  # k is chosen on a 1-2-5 grid: readable, and a run can be repeated at the same k


def k_grid(k_max: float = 1e7) -> list[float]:
    out, decade = [], 1.0
    while decade <= k_max:
        out += [m * decade for m in K_STEPS]
        decade *= 10
    return out


def wan_demand_bps(topo: Topology, scale: float, ranks_per_dc: dict[str, int], max_connections: int | None) -> float:
    """Bits/s the emulated WAN carries at scale k when every rank talks to every rank of the other DCs at
    once (an all-to-all exchange: the most a job's traffic asks of the WAN). Each link direction, as the emulator
    builds it at k (testbed/plan/network.py lower_network), carries its rate, or what the rank pairs across it keep
    in flight if less: ranks(a) x ranks(b) pairs, each over one connection (gloo), or over the launch's multi-TCP
    count when `max_connections` is given (NCCL's sockets: plan/network.py covering_connections, the count `testbed
    launch` gives every rank), each connection a window per round trip (testbed.costs.tcp)."""
    net = lower_network(topo, scale)
    per_pair = covering_connections(net, max_connections) if max_connections else 1
    total = 0.0
    for link in net.links:
        e = net.emulated(link.a, link.b)
        pairs = ranks_per_dc.get(link.a, 0) * ranks_per_dc.get(link.b, 0)
        if pairs:
            total += 2 * bytes_s_to_bps(striped_rate(e.capacity_bytes_s, pairs * per_pair, e.window_bytes, e.rtt_s))
    return total


def choose_scale(topo: Topology, ceiling_bps: float, ranks_per_dc: dict[str, int],
                 max_connections: int | None) -> float:
    """The smallest k (1-2-5 grid) the machine carries: the WAN's demand at k (`wan_demand_bps`) within
    HEADROOM_SHARE of the measured ceiling, and every link inside check_scale's range. One line naming the
    shortfall otherwise."""
    if not math.isfinite(ceiling_bps) or ceiling_bps <= 0:
        raise SpecError("--scale", f"a measured ceiling of {ceiling_bps} bit/s leaves no room for a WAN",
                        "pass --scale K")
    budget = ceiling_bps * HEADROOM_SHARE
    for k in k_grid():
        try:
            check_scale(topo, k, field="--scale")
        except SpecError:
            continue
        if wan_demand_bps(topo, k, ranks_per_dc, max_connections) <= budget:
            return k
    raise SpecError("--scale", f"no k fits {topo.name}'s WAN in {budget / 1e6:,.0f} Mbit/s", "pass --scale K")


def _k(x: float) -> str:
    return f"{x:,.6g}"


def check_scale(topo: Topology, scale: float, *, field: str = "emulation.scale", lan_gpus_per_host: int = 1) -> None:
    """Every WAN link divided by k must carry at least MIN_EMULATED_BPS and at most MAX_EMULATED_BPS, and every
    scaled window must fit a receive buffer; one line naming the field and the usable range otherwise."""
    if not math.isfinite(scale) or scale <= 0:
        raise SpecError(field, f"{scale} is not a positive finite scale factor", "use e.g. 2000, or 0 for auto")
    if not topo.links:
        return
    slow = min(topo.links, key=lambda link: link.gbps)
    fast = max(topo.links, key=lambda link: link.gbps)
    k_max = gbps_to_bps(slow.gbps) / MIN_EMULATED_BPS
    k_min = gbps_to_bps(fast.gbps) / MAX_EMULATED_BPS
    if scale > k_max:
        raise SpecError(field, f"k={_k(scale)} brings link {'-'.join(slow.between)} to "
                        f"{gbps_to_bps(slow.gbps) / scale:,.4g} "
                        f"bit/s, below the {MIN_EMULATED_BPS / 1e3:g} kbit/s an emulated link needs (the Atlas sidecar "
                        f"parks a paused flow at 1/100 of the link, 8 kbit/s at least)", f"use k <= {_k(k_max)}")
    if scale < k_min:
        raise SpecError(field, f"k={_k(scale)} leaves link {'-'.join(fast.between)} at {fast.gbps / scale:,.4g} "
                        f"Gbit/s, above the {MAX_EMULATED_BPS / 1e9:g} Gbit/s a veth and HTB can carry",
                        f"use k >= {_k(k_min)}")
    for link in topo.links:
        w = max(int(mib_to_bytes(topo.window_mb(link)) / scale), MIN_WINDOW)
        if receive_buffer(w) > MAX_SYSCTL_INT:
            k = mib_to_bytes(topo.window_mb(link)) / (MAX_SYSCTL_INT * 0.75)
            raise SpecError(field, f"k={_k(scale)} leaves link {'-'.join(link.between)} a {w / 2**30:,.3g} GiB window, "
                            f"more than a kernel receive buffer holds (2 GiB)", f"use k >= {_k(k)}")
    for d in topo.dcs:
        lan = gbps_to_bps(d.intra_gbps) * lan_gpus_per_host / scale
        if lan < MIN_EMULATED_BPS and lan <= MAX_LAN_BPS:
            raise SpecError(field, f"k={_k(scale)} brings DC {d.name}'s fabric to {lan:,.4g} bit/s per host, below "
                            f"{MIN_EMULATED_BPS / 1e3:g} kbit/s", f"use k <= {_k(lan * scale / MIN_EMULATED_BPS)}")


def window_notes(topo: Topology, scale: float) -> list[str]:
    """What the emulation at k cannot carry as the spec says: a host's links with different windows (a receive
    buffer is per host), a window that k takes below 64 KiB."""
    notes = []
    for dc in topo.dcs:
        wins = {topo.window_mb(link) for link in topo.links if dc.name in link.between}
        if len(wins) > 1:
            notes.append(f"{dc.name}: its links have different TCP windows {sorted(wins)} MiB; training workers clamp "
                         f"each connection to its link's, other processes (testbed launch) get the kernel's window "
                         f"for a receive buffer sized for the largest (a buffer is per host)")
    for link in topo.links:
        w = mib_to_bytes(topo.window_mb(link)) / scale
        if w < MIN_WINDOW:
            a, b = link.between
            notes.append(f"{a}-{b}: window {topo.window_mb(link):g} MiB / scale {scale:g} = {w / 1024:.1f} KiB is "
                         f"below 64 KiB; emulated with 64 KiB, so one connection carries "
                         f"{MIN_WINDOW / w:.1f}x more than the scaled real-world one")
    return notes


def check_transfer_bytes(act_bytes: list[float], grad_bytes: list[float], dp: int, scale: float,
                         field: str = "emulation.scale") -> None:
    """Every emulated transfer (an activation, a ring all-reduce chunk) must be at least one byte after
    scaling, or the workers would send 1 byte and overstate it."""
    sizes = [(b, "an activation") for b in act_bytes[:-1] if b > 0]
    if dp > 1:
        sizes += [(g / dp, "a ring all-reduce chunk") for g in grad_bytes if g > 0]
    if not sizes:
        return
    nbytes, what = min(sizes)
    if nbytes / scale < 1:
        raise SpecError(field, f"k={_k(scale)} shrinks {what} of {nbytes:,.0f} bytes below one byte per transfer",
                        f"use k <= {_k(nbytes)}")

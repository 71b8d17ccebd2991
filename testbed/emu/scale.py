"""Choosing the emulation scale factor k (emulated links at 100-200 Mbit/s), and the range of k a
topology can be emulated at: rates, windows and bytes divided by k must stay inside what HTB, the
kernel's TCP buffers and the workers can carry. Checked before anything is built."""

from __future__ import annotations

import math

from testbed.errors import SpecError
from testbed.spec.topology import Topology

MIN_WINDOW = 64 * 1024  # below this one TCP connection no longer behaves like one (MSS is ~9 KB)
MTU = 9000
TCP_HEADERS = 52  # IPv4 and TCP headers with the timestamp option
MSS = MTU - TCP_HEADERS  # TCP payload per jumbo packet


def emulated_window(window_bytes: float, scale: float, mss: int = MSS) -> int:
    """A real-world window as one emulated connection carries it: divided by k, at least 64 KiB, and a whole
    number of segments of `mss` (a receiver advertises, and a sender fills, a window in whole segments; bench
    tcp_fidelity.py measured a 128 KiB clamp carrying 14 segments' worth)."""
    w = max(window_bytes / scale, MIN_WINDOW)
    return max(1, round(w / mss)) * mss
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
    once (an all-to-all exchange: the most a job's traffic asks of the WAN). Each link direction carries its
    rate, or what the rank pairs across it keep in flight if less: ranks(a) x ranks(b) pairs, each over one
    connection (gloo), or over the launch's multi-TCP count when `max_connections` is given (NCCL's sockets,
    as many as cover the link's bandwidth-delay product), each connection a window per round trip
    (testbed.costs.tcp)."""
    from testbed.costs.tcp import connections_for, striped_rate

    total = 0.0
    for link in topo.links:
        a, b = link.between
        cap = link.gbps * 1e9 / 8 / scale
        win, rtt = emulated_window(topo.window_mb(link) * 2**20, scale), 2 * link.latency_ms / 1e3
        per_pair = connections_for(cap, win, rtt, max_connections) if max_connections else 1
        pairs = ranks_per_dc.get(a, 0) * ranks_per_dc.get(b, 0)
        total += 2 * striped_rate(cap, pairs * per_pair, win, rtt) * 8 if pairs else 0.0
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
    k_max = slow.gbps * 1e9 / MIN_EMULATED_BPS
    k_min = fast.gbps * 1e9 / MAX_EMULATED_BPS
    if scale > k_max:
        raise SpecError(field, f"k={_k(scale)} brings link {'-'.join(slow.between)} to {slow.gbps * 1e9 / scale:,.4g} "
                        f"bit/s, below the {MIN_EMULATED_BPS / 1e3:g} kbit/s an emulated link needs (the Atlas sidecar "
                        f"parks a paused flow at 1/100 of the link, 8 kbit/s at least)", f"use k <= {_k(k_max)}")
    if scale < k_min:
        raise SpecError(field, f"k={_k(scale)} leaves link {'-'.join(fast.between)} at {fast.gbps / scale:,.4g} "
                        f"Gbit/s, above the {MAX_EMULATED_BPS / 1e9:g} Gbit/s a veth and HTB can carry",
                        f"use k >= {_k(k_min)}")
    for link in topo.links:
        w = max(int(topo.window_mb(link) * 2**20 / scale), MIN_WINDOW)
        if receive_buffer(w) > MAX_SYSCTL_INT:
            k = topo.window_mb(link) * 2**20 / (MAX_SYSCTL_INT * 0.75)
            raise SpecError(field, f"k={_k(scale)} leaves link {'-'.join(link.between)} a {w / 2**30:,.3g} GiB window, "
                            f"more than a kernel receive buffer holds (2 GiB)", f"use k >= {_k(k)}")
    for d in topo.dcs:
        lan = d.intra_gbps * 1e9 * lan_gpus_per_host / scale
        if lan < MIN_EMULATED_BPS and lan <= MAX_LAN_BPS:
            raise SpecError(field, f"k={_k(scale)} brings DC {d.name}'s fabric to {lan:,.4g} bit/s per host, below "
                            f"{MIN_EMULATED_BPS / 1e3:g} kbit/s", f"use k <= {_k(lan * scale / MIN_EMULATED_BPS)}")


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

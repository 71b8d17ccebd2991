"""Choosing the emulation scale factor k (emulated links at 100-200 Mbit/s), and the range of k a
topology can be emulated at: rates, windows and bytes divided by k must stay inside what HTB, the
kernel's TCP buffers and the workers can carry. Checked before anything is built."""

from __future__ import annotations

import math

from testbed.errors import SpecError
from testbed.spec.topology import Topology

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


def _k(x: float) -> str:
    return f"{x:,.6g}"


def check_scale(topo: Topology, scale: float, *, field: str = "emulation.scale", lan_gpus_per_host: int = 1) -> None:
    """Every WAN link divided by k must carry at least MIN_EMULATED_BPS and at most MAX_EMULATED_BPS, and every
    scaled window must fit a receive buffer; one line naming the field and the usable range otherwise."""
    from testbed.emu.build import MAX_LAN_BPS, MIN_WINDOW, receive_buffer

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

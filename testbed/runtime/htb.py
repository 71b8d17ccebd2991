"""The per-flow HTB classes' parameters and the one netlink change the Atlas sidecar makes to them.

The emulator's builder (emu/flowctl.py) creates the classes with these values; the sidecar, which
runs in the WAN node's own namespace (and image), only changes a class's rate and priority.
Standard library only; the netlink handle (pyroute2's IPRoute) is the caller's."""

from __future__ import annotations

# A class's burst at its ceiling: what it may send at the veth's speed after an idle spell, so 1 ms of the rate
# (about the timer slack HTB needs to hold its rate), and at least two jumbo frames. A real WAN link has no such
# head start: a fixed 128 KiB let every transfer's first 128 KiB through at once (5 ms early on a 200 Mbit/s
# link, 2.6 ms on a 400 Mbit/s LAN: docs/fidelity.md).
BURST_S = 1e-3
FRAME_BYTES = 9014  # an MTU-9000 packet as HTB counts it (with its Ethernet header)
PAYLOAD_BYTES = 8948  # the TCP payload it carries (IPv4 and TCP headers with timestamps: 52 bytes)
MIN_BURST_BYTES = 2 * FRAME_BYTES
# A class's burst at its guaranteed rate: about two jumbo frames. HTB serves a class within its own
# rate before any class that borrows, whatever their priorities; with the link's 128 KiB, a replica
# idle for half a second had saved enough to send 128 KiB (5 ms of a 200 Mbit/s link) during
# another's turn at the start of every transfer.
RATE_BURST_BYTES = 18 * 1024
# What a class sends per turn of HTB's round robin between classes of one priority: one jumbo frame, so
# replicas sharing a link interleave packet by packet (64 KiB turns let the first of three 178 KB transfers
# finish 12 ms before the last, where the simulator's fair share finishes them together)
QUANTUM = FRAME_BYTES
MIN_RATE_BPS = 8_000  # HTB needs a positive rate; a "paused" class gets this trickle and borrows nothing


def wire_bps(payload_bps: float) -> float:
    """The HTB rate (bits/s on the wire) that carries `payload_bps` of TCP payload in full-size packets: the
    simulator's capacities are what a transfer gets, and headers take 0.7 % of a jumbo frame."""
    return payload_bps * FRAME_BYTES / PAYLOAD_BYTES


def burst_bytes(rate_bps: float) -> int:
    """HTB burst for a rate in bits/s: BURST_S of it, at least MIN_BURST_BYTES."""
    return max(MIN_BURST_BYTES, int(rate_bps * BURST_S / 8))


def set_class(ipr, idx: int, minor: int, rate_bps: float, ceil_bps: float | None, prio: int) -> None:
    """One netlink change of an HTB class (pyroute2 replaces the whole class: pass everything); rates in
    payload bits/s."""
    rate = max(int(wire_bps(rate_bps)), MIN_RATE_BPS)
    ceil = max(int(wire_bps(ceil_bps or rate_bps)), rate)
    ipr.tc("change-class", "htb", idx, handle=f"1:{minor:x}", parent="1:1", rate=f"{rate}bit", ceil=f"{ceil}bit",
           burst=RATE_BURST_BYTES, cburst=burst_bytes(ceil), prio=prio, quantum=QUANTUM)

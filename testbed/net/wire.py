"""Wire and HTB arithmetic shared by the plan, the emulator's builder and the role processes: frame sizes, an
emulated path's MTU and HTB quantum, a round-robin turn in bytes, header overhead, class rates and priorities.

Ground floor: the standard library only, and nothing of the package above it.
"""

from __future__ import annotations

FRAME_BYTES = 9014  # an MTU-9000 packet as HTB counts it (with its Ethernet header)
PAYLOAD_BYTES = 8948  # the TCP payload it carries (IPv4 and TCP headers with timestamps: 52 bytes)
# Every class's bucket, at its guaranteed rate (burst) and at its ceiling (cburst): one jumbo frame, the least that
# holds a packet. What a bucket holds leaves at the veth's speed after an idle spell, a head start no real WAN link
# gives. 1 ms of the rate, at least two frames (18 KiB at the guaranteed rate), let an idle link's first 28-32 KB
# through at once (a 64 KB message at 20 Mbit/s 11.4 ms early, 262 KB at 200 Mbit/s 1.3 ms: bench/tcp_fidelity.py
# --only burst), and the simulator read 1-2 % slow on almost every fidelity case (docs/fidelity.md, "HTB's burst");
# a 128 KiB bucket, before that, 5 ms early at 200 Mbit/s. With one frame the rate still holds (200-800 Mbit/s:
# 20 MB within 0.5 % of bytes / C; bench/tcp_fidelity.py --only transfer within 0.1 % of before), and what is
# left early is one GSO packet (two segments of the path's MTU: 3-18 KB, `link_mtu`).
BURST_BYTES = FRAME_BYTES
JUMBO_MTU = FRAME_BYTES - 14
# An emulated WAN path's packets last on its link what a jumbo frame lasts at this rate (the emulator's target link
# rate, testbed/emu/scale.py): at scale k a packet stands for k times its bytes, and a slow emulated link's jumbo
# frames (5.7 ms each at 22.9 Mbit/s) made its round robin between replicas that coarse, a timing noise of several
# milliseconds per shared transfer that a real link's frames (tens of microseconds) do not have (docs/fidelity.md,
# "Packets at scale"). Hosts route each peer DC at `link_mtu` of its link.
FULL_FRAME_BPS = 200e6
MIN_MTU = 1500  # never smaller than Ethernet's: below 200 Mbit/s x 1500/9000 packets are longer than at the target
# Hosts cap a TSO/GSO packet at two segments (emu/build.py), so no packet HTB sees exceeds two frames
GSO_SEGMENTS = 2


def link_mtu(link_bps: float) -> int:
    """The MTU of an emulated WAN path whose link carries `link_bps` (bits/s): a packet lasts on it what a jumbo
    frame lasts at FULL_FRAME_BPS, between MIN_MTU and the jumbo MTU."""
    return int(min(JUMBO_MTU, max(MIN_MTU, round(JUMBO_MTU * link_bps / FULL_FRAME_BPS))))


def mtu_quantum(mtu: int) -> int:
    """What a class sends per turn of HTB's round robin on a path of `mtu`: the largest packet it carries,
    GSO_SEGMENTS frames (`link_quantum`)."""
    return GSO_SEGMENTS * (mtu + 14)


def link_quantum(link_bps: float) -> int:
    """What a class sends per turn of HTB's round robin on a link of `link_bps` (bits/s): the largest packet it
    carries, GSO_SEGMENTS frames of the path's MTU. HTB sends a whole packet per turn whatever its class's deficit,
    so with a quantum below the packets (one frame against two-segment packets) classes shared a link by packet
    count, not bytes: a replica's sub-quantum tails went one per turn behind its siblings' full packets, which held
    leaders back to their followers (docs/fidelity.md, "HTB's quantum"). Small turns keep replicas interleaved packet
    by packet (64 KiB turns let the first of three 178 KB transfers finish 12 ms before the last)."""
    return mtu_quantum(link_mtu(link_bps))


def turn_bytes(link_bps: float, scale: float) -> float:
    """A round-robin turn of an emulated link of `link_bps` (bits/s, emulated) in real-world bytes: k x its quantum."""
    return scale * link_quantum(link_bps)
IDLE_PRIO = 6  # a replica class with nothing in turn (fair sharing: every class, BubbleTea's KV caches' too)
# HTB's last priority: BubbleTea's KV caches on a link with Atlas's turns, after every replica, idle ones included (as
# the simulator's KV_RANK), so a transfer starting before the sidecar has ranked it still goes ahead of the caches
KV_PRIO = 7
# The IP TOS byte (DSCP AF11) a worker sets on its all-reduce connections, as deployments give collectives a traffic
# class of their own (NCCL_IB_TC): a host's NIC carries them in a class beside the pipeline's (emu/shaping.py)
ALLREDUCE_TOS = 0x28
ALLREDUCE_MINOR = 0x20  # that class on a host's NIC
MIN_RATE_BPS = 8_000  # HTB needs a positive rate; a "paused" class gets this trickle and borrows nothing


def wire_bps(payload_bps: float, mtu: int = JUMBO_MTU) -> float:
    """The HTB rate (bits/s on the wire) that carries `payload_bps` of TCP payload in full-size packets of `mtu`: the
    simulator's capacities are what a transfer gets, and headers (66 bytes a frame with Ethernet's) take 0.7 % of
    a jumbo frame, 4.4 % of a 1,500-byte one."""
    return payload_bps * (mtu + 14) / (mtu - 52)


def wire_rates(rate_bps: float, ceil_bps: float | None, mtu: int) -> tuple[int, int]:
    """A class's guaranteed rate and ceiling on the wire (bits/s) for payload rates in packets of `mtu`: HTB needs a
    positive rate (MIN_RATE_BPS) and a ceiling no lower than the rate; no ceiling means the rate."""
    rate = max(int(wire_bps(rate_bps, mtu)), MIN_RATE_BPS)
    return rate, max(int(wire_bps(ceil_bps or rate_bps, mtu)), rate)


def trickle_bps(link_bps: float) -> float:
    """The rate guaranteed to a class that waits its turn on a link of `link_bps` (payload bits/s): 1/100 of the
    link, never below MIN_RATE_BPS; it borrows the rest up to its ceiling, the link's rate."""
    return max(link_bps / 100, MIN_RATE_BPS)


def kv_class(link_bps: float, temporal: bool) -> tuple[float, float, int]:
    """(guaranteed rate, ceiling, HTB priority) of BubbleTea's KV caches' class on a hop of `link_bps` (payload
    bits/s): a trickle and the link as ceiling, as a replica class. On a fair-shared link at the replicas'
    priority (IDLE_PRIO), so the caches take a round-robin share beside them; on a link with Atlas's turns at
    the last (KV_PRIO), after every replica, idle ones included, as the simulator's KV flows
    (testbed/sim/realised.py: `KV_RANK`)."""
    return trickle_bps(link_bps), link_bps, KV_PRIO if temporal else IDLE_PRIO

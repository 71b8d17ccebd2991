"""Wire and HTB arithmetic shared by the plan, the emulator's builder and the role processes: frame sizes, an
emulated path's MTU and HTB quantum, a round-robin turn in bytes, header overhead, class rates and priorities.

Ground floor: the standard library only, and nothing of the package above it.
"""

from __future__ import annotations

FRAME_BYTES = 9014  # an MTU-9000 packet as HTB counts it (with its Ethernet header)
PAYLOAD_BYTES = 8948  # the TCP payload it carries (IPv4 and TCP headers with timestamps: 52 bytes)
JUMBO_MTU = FRAME_BYTES - 14
# An emulated WAN path's packets last on its link what a jumbo frame lasts at this rate (the emulator's target link
# rate, testbed/emu/scale.py): at scale k a packet stands for k times its bytes, so a slow emulated link's jumbo
# frames would make its round robin between replicas coarser than a real link's (docs/fidelity.md, "Packets at
# scale"). Hosts route each peer DC at `link_mtu` of its link.
FULL_FRAME_BPS = 200e6
MIN_MTU = 1500  # never smaller than Ethernet's: below 200 Mbit/s x 1500/9000 packets are longer than at the target
# Hosts cap a TSO/GSO packet at two segments (emu/build.py), so no packet HTB sees exceeds two frames
GSO_SEGMENTS = 2


def link_mtu(link_bps: float) -> int:
    """The MTU of an emulated WAN path whose link carries `link_bps` (bits/s): a packet lasts on it what a jumbo
    frame lasts at FULL_FRAME_BPS, between MIN_MTU and the jumbo MTU."""
    return int(min(JUMBO_MTU, max(MIN_MTU, round(JUMBO_MTU * link_bps / FULL_FRAME_BPS))))


def burst_bytes(mtu: int) -> int:
    """Every HTB class's bucket on a path of `mtu`, at its guaranteed rate (burst) and at its ceiling (cburst): one
    frame of the path. What a bucket holds leaves at the veth's speed after an idle spell, a head start no real WAN
    link gives beyond its first frame; in time that is the bucket over the link's rate, so a bucket of fixed bytes
    is a long head start on a slow link: one jumbo frame is 5.2 ms at 13.9 Mbit/s (six 1,500-byte frames), and the
    replica that reached an idle link first left its sibling that much behind, every time the two met there
    (docs/fidelity.md, "The bucket in time"). One frame of the path lasts what a jumbo frame lasts at
    FULL_FRAME_BPS (0.36 ms) down to MIN_MTU's paths (0.9 ms at 13.9 Mbit/s), and holds the rate: a class may send
    a packet larger than its bucket (its tokens go negative), and the bucket covers a wake-up that late."""
    return mtu + 14


def mtu_quantum(mtu: int) -> int:
    """What a class sends per turn of HTB's round robin on a path of `mtu`: the largest packet it carries,
    GSO_SEGMENTS frames (`link_quantum`)."""
    return GSO_SEGMENTS * (mtu + 14)


def link_quantum(link_bps: float) -> int:
    """What a class sends per turn of HTB's round robin on a link of `link_bps` (bits/s): the largest packet it
    carries, GSO_SEGMENTS frames of the path's MTU. HTB sends a whole packet per turn whatever its class's deficit,
    so a quantum below the packets would share a link by packet count, not bytes (docs/fidelity.md, "HTB's
    quantum"); turns no larger keep replicas interleaved packet by packet."""
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

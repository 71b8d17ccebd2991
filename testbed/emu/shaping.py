"""HTB rate shaping (with an explicit burst) on a WAN egress, and the leaf queue under it.

Class tree on each WAN egress (the replica, sidecar and KV classes are added under 1:1 later, emu/flowctl.py):
  1: htb default 10  ->  1:1 (link rate)  ->  1:<minor> (1:10 the default class)  ->  leaf <minor>: (bfifo, or netem)

Where the run delays with netem, every class's leaf is a netem with the link's delay, not only the default
class's: a packet HTB files under a replica's class never passes the default leaf.
"""

from __future__ import annotations

import math

from testbed.net.units import bps_to_bytes_s, mib_to_bytes
from testbed.runtime.htb import (
    ALLREDUCE_MINOR,
    ALLREDUCE_TOS,
    IDLE_PRIO,
    JUMBO_MTU,
    burst_bytes,
    class_args,
    kv_class,
    mtu_quantum,
    trickle_bps,
    wire_bps,
)

# Deep enough that no window the runs open is ever dropped: the simulator has no loss model, and at scale k a
# window is k times fewer packets than in the real world, so a drop costs a 200 ms retransmission timeout where
# the real connection would recover within a round trip (a BDP-sized queue made emulated runs 10-30 % slower,
# with iterations varying 2x: docs/fidelity.md). Packets only queue when the windows overfill the link.
MIN_QUEUE_BYTES = mib_to_bytes(32)


def queue_bytes(rate_bps: float, rtt_s: float) -> int:
    """A shaper's queue: four bandwidth-delay products, at least MIN_QUEUE_BYTES."""
    return max(4 * int(bps_to_bytes_s(rate_bps) * max(rtt_s, 0.01)), MIN_QUEUE_BYTES)


def rate_class(verb: str, dev: str, parent: str, classid: str, rate_bps: float, mtu: int) -> list[str]:
    """`tc class add|change` of an HTB class guaranteed `rate_bps` of payload in packets of `mtu` (HTB counts
    frames: wire_bps) with that as its ceiling, an explicit burst of one frame of the path (`burst_bytes`; tc's
    default, a jiffy's worth, loses 4-11 % of the rate on veth) and the path's quantum (tc's default, rate / 10, is
    up to 200 KB a turn against the flow classes' two packets where the default class shares a priority with
    them)."""
    rate, burst = f"{int(wire_bps(rate_bps, mtu))}bit", str(burst_bytes(mtu))
    return ["tc", "class", verb, "dev", dev, "parent", parent, "classid", classid, "htb", "rate", rate, "ceil", rate,
            "burst", burst, "cburst", burst, "quantum", str(mtu_quantum(mtu))]


def htb_commands(dev: str, rate_bps: float, rtt_s: float, netem_delay_ms: float | None, mtu: int
                 ) -> list[list[str]]:
    """The link's classes at `rate_bps` of payload (`rate_class`) and a deep leaf queue, and the class that carries
    the link's TCP control packets (`ack_class`) ahead of the data; `mtu`: its hosts' packet size (runtime/htb.py
    link_mtu)."""
    return [
        ["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
        rate_class("add", dev, "1:", "1:1", rate_bps, mtu),
        rate_class("add", dev, "1:1", f"1:{DEFAULT_MINOR:x}", rate_bps, mtu),
        leaf_command(dev, DEFAULT_MINOR, rate_bps, rtt_s, netem_delay_ms),
        ack_class("add", dev, rate_bps, mtu),
        leaf_command(dev, ACK_MINOR, rate_bps, rtt_s, netem_delay_ms),
        ["tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", str(ACK_FILTER_PRIO), "u32",
         "match", "ip", "protocol", "6", "0xff", "match", "u16", "0", hex(0x10000 - ACK_MAX_IP_BYTES), "at", "2",
         "flowid", f"1:{ACK_MINOR:x}"],
    ]


DEFAULT_MINOR = 0x10  # the link's default class 1:10: whatever no filter classes
# TCP's control packets (acknowledgements; SYN and FIN): IP packets under ACK_MAX_IP_BYTES (a pure ACK with timestamps
# is 52 bytes, with SACK blocks up to 84), matched before any flow class (emu/flowctl.py filters at prio 10).
ACK_MINOR = 0x30
ACK_MAX_IP_BYTES = 128  # a power of two: u32 matches the IP total length under it with one mask
ACK_FILTER_PRIO = 1


def ack_bps(link_bps: float, mtu: int) -> float:
    """The ACK class's guaranteed rate on a link of `link_bps` (payload bits/s, as `class_args` takes rates): on the
    wire, one control packet of the largest size the ACK filter takes (ACK_MAX_IP_BYTES and an Ethernet header) for
    every segment the other direction's data can carry at the link's rate in packets of `mtu` (hosts acknowledge
    every packet at once: `quickack`). The link's default class is guaranteed the whole link, so while the other
    direction's data fills it HTB's parent has no tokens to lend and the ACK class gets only its guarantee: at the
    1,500-byte packets of a slow emulated link the acknowledgements take 2-5 % of the data's rate, and a 1 %
    guarantee held them back and slowed the acknowledged direction by 12-16 % (docs/fidelity.md, "Acknowledgements
    of a two-way link"). At least `trickle_bps`."""
    return max(link_bps * (ACK_MAX_IP_BYTES + 14) / (mtu + 14), trickle_bps(link_bps))


def ack_class(verb: str, dev: str, rate_bps: float, mtu: int) -> list[str]:
    """`tc class add|change` of the class for a link's TCP control packets: `ack_bps` guaranteed (what the other
    direction's acknowledgements take at most), the link as ceiling, HTB's first priority. In the class of
    the data they travel with (a replica's, or the default), the acknowledgements of one direction's transfers
    queued behind the other direction's window bursts, up to a window's time on the link (tens of ms), and held back
    the acknowledged transfer's next window: 1F1B sends activations and gradients across a link at once, and the
    emulated iteration of seed 131 topology 8 (pp-wan, dp 1) ran 10.5 % slower than simulated
    (docs/fidelity.md, "Acknowledgements behind data"). The simulator's links carry acknowledgements for free."""
    return ["tc", "class", verb, "dev", dev, "parent", "1:1", "classid", f"1:{ACK_MINOR:x}", "htb",
            *class_args(ack_bps(rate_bps, mtu), rate_bps, 0, mtu)]


def leaf_command(dev: str, minor: int, rate_bps: float, rtt_s: float, netem_delay_ms: float | None,
                 verb: str = "add") -> list[str]:
    """`tc qdisc add|change` of the queue under HTB class 1:<minor> (handle <minor>:) on a link of `rate_bps`
    (payload bits/s) and round trip `rtt_s`: a netem of the link's one-way delay where the run delays with netem,
    else a bfifo (the NFQUEUE delay line delays the link's packets before HTB sees them)."""
    head = ["tc", "qdisc", verb, "dev", dev, "parent", f"1:{minor:x}", "handle", f"{minor:x}:"]
    if netem_delay_ms is not None:  # a netem even at 0 ms: a WAN that changes may give the link a delay later
        packets = math.ceil(queue_bytes(rate_bps, rtt_s) / 1500) + 1000
        return [*head, "netem", "delay", f"{netem_delay_ms:g}ms", "limit", str(packets)]
    return [*head, "bfifo", "limit", str(queue_bytes(rate_bps, rtt_s))]


def rate_change_commands(dev: str, rate_bps: float, mtu: int, replica_minors: tuple[int, ...] = (),
                         kv: tuple[int, bool] | None = None) -> list[list[str]]:
    """Re-rate a link made by `htb_commands` (its class 1:1, default class 1:10, ACK class) as a running link changes,
    the replica classes that share it fairly (emu/train.py classify_replicas: a trickle guaranteed, the
    link's rate as ceiling; a temporal link's classes are the sidecar's to re-rate), and BubbleTea's KV class
    `kv` (minor, whether the link has Atlas's turns: runtime/htb.py kv_class), which keeps its priority."""
    cmds = [rate_class("change", dev, parent, cid, rate_bps, mtu) for parent, cid in (("1:", "1:1"), ("1:1", "1:10"))]
    cmds.append(ack_class("change", dev, rate_bps, mtu))
    replica = class_args(trickle_bps(rate_bps), rate_bps, IDLE_PRIO, mtu)  # as classify_replicas made them
    cmds += [["tc", "class", "change", "dev", dev, "parent", "1:1", "classid", f"1:{minor:x}", "htb", *replica]
             for minor in replica_minors]
    if kv is not None:
        cmds.append(["tc", "class", "change", "dev", dev, "parent", "1:1", "classid", f"1:{kv[0]:x}", "htb",
                     *class_args(*kv_class(rate_bps, kv[1]), mtu)])
    return cmds


def lan_commands(dev: str, rate_bps: float) -> list[list[str]]:
    """A host's NIC into its DC fabric at `rate_bps` (payload bits/s): `htb_commands`' classes for the pipeline's
    messages (and anything else), and beside them, not under them, a class of the same rate for the all-reduce's
    connections (marked ALLREDUCE_TOS by the workers), as the simulator gives every transfer inside a DC the
    fabric's bandwidth alone. In one FIFO, a stage's ring all-reduce, started as its last backward ends, queued
    its chunk ahead of the last gradient just sent to the previous stage, which then came 1-11 ms late at every
    stage, and so later up the pipeline (docs/fidelity.md, "The all-reduce on a host's NIC")."""
    cid = f"1:{ALLREDUCE_MINOR:x}"
    return [
        *htb_commands(dev, rate_bps, 0.0, None, JUMBO_MTU),
        rate_class("add", dev, "1:", "1:2", rate_bps, JUMBO_MTU),
        rate_class("add", dev, "1:2", cid, rate_bps, JUMBO_MTU),
        leaf_command(dev, ALLREDUCE_MINOR, rate_bps, 0.0, None),
        ["tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "5", "u32", "match", "ip", "tos",
         hex(ALLREDUCE_TOS), "0xfc", "flowid", cid],
    ]

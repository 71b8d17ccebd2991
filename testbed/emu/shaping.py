"""HTB rate shaping (with an explicit burst) on a WAN egress, and the leaf queue under it.

Class tree on each WAN egress (the Atlas sidecar adds per-flow classes under 1:1 later):
  1: htb default 10  ->  1:1 (link rate)  ->  1:10 (default class)  ->  leaf (bfifo, or netem)
"""

from __future__ import annotations

import math

BURST = "128k"  # measured here: HTB's default burst loses 4-11 % of the rate on veth (docs/emulation.md)


def queue_bytes(rate_bps: float, rtt_s: float) -> int:
    """A bandwidth-delay product of buffer (at least 256 KB): a router-like queue, not bufferbloat."""
    return max(int(rate_bps / 8 * max(rtt_s, 0.01)), 256 * 1024)


def htb_commands(dev: str, rate_bps: float, rtt_s: float, netem_delay_ms: float | None) -> list[list[str]]:
    rate = f"{int(rate_bps)}bit"
    cmds = [
        ["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
        ["tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", rate, "ceil", rate,
         "burst", BURST, "cburst", BURST],
        ["tc", "class", "add", "dev", dev, "parent", "1:1", "classid", "1:10", "htb", "rate", rate, "ceil", rate,
         "burst", BURST, "cburst", BURST],
    ]
    if netem_delay_ms:
        packets = math.ceil(queue_bytes(rate_bps, rtt_s) / 1500) + 1000
        cmds.append(["tc", "qdisc", "add", "dev", dev, "parent", "1:10", "handle", "10:", "netem", "delay",
                     f"{netem_delay_ms}ms", "limit", str(packets)])
    else:
        cmds.append(["tc", "qdisc", "add", "dev", dev, "parent", "1:10", "handle", "10:", "bfifo", "limit",
                     str(queue_bytes(rate_bps, rtt_s))])
    return cmds


def rate_change_commands(dev: str, rate_bps: float) -> list[list[str]]:
    """Re-rate a link made by `htb_commands` (its class 1:1 and default class 1:10) as a running link changes."""
    rate = f"{int(rate_bps)}bit"
    return [["tc", "class", "change", "dev", dev, "parent", parent, "classid", cid, "htb", "rate", rate, "ceil", rate,
             "burst", BURST, "cburst", BURST] for parent, cid in (("1:", "1:1"), ("1:1", "1:10"))]

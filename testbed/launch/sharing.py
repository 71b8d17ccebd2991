"""Atlas for a foreign job, where it can apply.

- Ports: each emulated host's ephemeral ports are pinned to its own block (`ranks.port_ranges`,
  through the per-namespace sysctl net.ipv4.ip_local_port_range). gloo and NCCL listen and connect on
  ephemeral ports, so every packet heading into a DC carries, as its destination port, a port of the
  receiving host: the port says whose flow it is without the job's help.
- Temporal sharing: on every WAN egress each replica (host index j: the replica whose stages sit on
  host j of each DC) gets an HTB class, matched by the receiving host's port block, with a 1 %
  guaranteed rate, a ceiling of the whole link and a fixed priority in replica order. HTB lends the
  link to the highest-priority class with data first: one replica at a time at full rate, the next
  filling what it leaves. A foreign job sends no transfer notices, so the order is fixed (replica 0
  first) rather than ranked per microbatch as the Atlas sidecar does for our own workers.
- Multi-TCP goes through NCCL's socket settings (`ranks.rank_env`); gloo has no such setting.
"""

from __future__ import annotations

from testbed.emu.build import Emulation
from testbed.launch.ranks import port_ranges

LAST_PRIO = 7  # HTB has priorities 0-7: replicas past the eighth share the last (round robin among them)


def pin_ports(emu: Emulation) -> dict[str, tuple[int, int]]:
    ranges = port_ranges(emu.addr)
    for h in emu.addr.hosts:
        lo, hi = ranges[h.ns]
        emu.backend.run(emu.node(h.ns), ["sysctl", "-qw", f"net.ipv4.ip_local_port_range={lo} {hi}"])
    return ranges


def temporal_classes(emu: Emulation, ranges: dict[str, tuple[int, int]]) -> dict[tuple[str, str], list[int]]:
    """Per-replica classes on both egresses of every WAN link; returns {(link a, b): [minors]} so that
    `remove_classes` can undo them (it is safe to call on a half-built set)."""
    from testbed.emu.flowctl import FlowControl
    from testbed.runtime.htb import trickle_bps

    made: dict[tuple[str, str], list[int]] = {}
    for w, link in zip(emu.addr.wans, emu.topo.links, strict=True):
        rate = link.gbps * 1e9 / emu.scale
        for towards in (w.a, w.b):
            hosts = [h for h in emu.addr.hosts if h.dc == towards]
            fc = FlowControl(emu, w.a, w.b, towards)
            for h in hosts:
                minor = 0x100 + h.index
                made.setdefault((w.a, w.b, towards), []).append(minor)  # type: ignore[arg-type]
                fc.add_class(minor, trickle_bps(rate), ceil_bps=rate, prio=min(h.index, LAST_PRIO),
                             ports=ranges[h.ns])
    return made  # type: ignore[return-value]


def turn_priorities(emu: Emulation) -> dict[str, int]:
    """Each host's address -> the HTB priority of the flows heading to it under temporal sharing."""
    return {h.ip: min(h.index, LAST_PRIO) for h in emu.addr.hosts}


def remove_classes(emu: Emulation, made: dict) -> None:
    from testbed.emu.flowctl import FlowControl

    for (a, b, towards), minors in made.items():
        FlowControl(emu, a, b, towards).remove(minors)

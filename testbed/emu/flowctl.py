"""Per-flow control on a WAN egress: the hooks the Atlas sidecar uses.

Each flow class is an HTB class under the link class 1:1, fed by u32 filters matching a
destination-port range, or by an iptables CLASSIFY rule matching a packet mark (this kernel's u32
has no mark key: a u32 `match mark` installs a filter with no key at all, which matches every
packet). Marks do not cross network namespaces (veth scrubs them), so a mark must be set inside
the WAN namespace, by a MARK rule in mangle PREROUTING (FORWARD is too late: the delay line's
NFQUEUE rule there is terminating). Rates change at runtime through netlink (pyroute2), which
takes about half a millisecond here; `FlowControl.set_rate` returns the time each change took.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from testbed.emu.sh import EmuError
from testbed.emu.shaping import leaf_command
from testbed.runtime.htb import MIN_RATE_BPS, class_args, set_class

if TYPE_CHECKING:
    from testbed.emu.build import Emulation

FILTER_PRIO = 10  # our u32 filters' priority on a WAN egress: after the link's ACK class (emu/shaping.py)


def port_blocks(lo: int, hi: int) -> list[tuple[int, int]]:
    """Cover [lo, hi] with (value, mask) blocks aligned on powers of two, as u32 matches need."""
    if not 0 <= lo <= hi <= 0xFFFF:
        raise ValueError(f"bad port range {lo}-{hi}")
    out = []
    while lo <= hi:
        size = lo & -lo if lo else 1 << 16
        while size > hi - lo + 1:
            size >>= 1
        out.append((lo, 0xFFFF & ~(size - 1)))
        lo += size
    return out


class FlowControl:
    """Flow classes on the egress of WAN link (a, b) towards `towards` (one direction)."""

    def __init__(self, emu: Emulation, a: str, b: str, towards: str) -> None:
        self.emu, self.a, self.b = emu, a, b
        self.wan = emu.node(emu.addr.wan(a, b).ns)
        self.dev = towards
        self.mtu = emu.mtu(a, b)  # its hosts' packet size: the wire rate's headers and the quantum (runtime/htb.py)
        self._ipr = None
        self.classes: dict[int, float] = {}
        self.prio = FILTER_PRIO

    @property
    def ipr(self):
        """Netlink into the WAN namespace, opened only for runtime changes and counters (set-up and
        removal use tc). pyroute2 creates a namespace that does not exist, so check first."""
        if self._ipr is None:
            from pyroute2 import IPRoute

            from testbed.emu.clean import our_namespaces

            if self.wan.ns not in our_namespaces():
                raise EmuError(f"{self.wan.ns} is not up")
            self._ipr = IPRoute(netns=self.wan.ns)
            found = self._ipr.link_lookup(ifname=self.dev)
            if not found:
                raise EmuError(f"{self.wan.ns} has no interface {self.dev}")
            self.idx = found[0]
        return self._ipr

    def add_class(self, minor: int, rate_bps: float, *, ceil_bps: float | None = None,
                  ports: tuple[int, int] | None = None, sports: tuple[int, int] | None = None,
                  mark: int | None = None, prio: int = 0) -> None:
        """A class 1:<minor> (hex, like tc) for the flows matching `ports` (destination port range),
        `sports` (source port range) or `mark`; `prio` 0-7 orders who borrows spare capacity first."""
        if minor in (1, 0x10) or not 0 < minor < 0xFFFF:
            raise ValueError("minor 1 and 0x10 are the link and default classes; pick another")
        self.emu.backend.run(self.wan, ["tc", "class", "add", "dev", self.dev, "parent", "1:1", "classid",
                                        f"1:{minor:x}", "htb", *class_args(rate_bps, ceil_bps, prio, self.mtu)])
        self.emu.backend.run(self.wan, self.leaf(minor, ceil_bps or rate_bps))
        self.add_filter(minor, ports=ports, sports=sports)
        if mark is not None:
            self.emu.backend.run(self.wan, ["iptables", "-t", "mangle", "-A", "POSTROUTING", "-o", self.dev, "-m",
                                            "mark", "--mark", str(mark), "-j", "CLASSIFY", "--set-class",
                                            f"1:{minor:x}"])
        self.classes[minor] = max(int(rate_bps), MIN_RATE_BPS)  # payload bits/s, as `set` records it

    def leaf(self, minor: int, link_bps: float, verb: str = "add") -> list[str]:
        """The queue under class 1:<minor>: with netem, the link's delay (as `up` built it; a WAN that changes
        re-delays every leaf, emu/wanchange.py), or every packet this class carries would cross undelayed."""
        e = self.emu.link(self.a, self.b)
        return leaf_command(self.dev, minor, link_bps, e.rtt_s, e.delay_ms if self.emu.delay == "netem" else None,
                            verb)

    def add_filter(self, minor: int, *, ports: tuple[int, int] | None = None,
                   sports: tuple[int, int] | None = None) -> None:
        """u32 filters sending a destination- or source-port range to class 1:<minor>."""
        for field, rng in (("dport", ports), ("sport", sports)):
            for v, m in port_blocks(*rng) if rng is not None else []:
                self.emu.backend.run(self.wan, ["tc", "filter", "add", "dev", self.dev, "parent", "1:", "protocol",
                                                "ip", "prio", str(self.prio), "u32", "match", "ip", field, str(v),
                                                hex(m), "flowid", f"1:{minor:x}"])

    def remove(self, minors: list[int]) -> None:
        """Remove our filters (all at our u32 priority) and these classes: the link returns to its
        default class. Filters go first: HTB keeps a class that a filter still points to."""
        self.emu.backend.run(self.wan, ["tc", "filter", "del", "dev", self.dev, "parent", "1:", "prio",
                                        str(self.prio)], check=False)
        for minor in minors:
            self.emu.backend.run(self.wan, ["tc", "class", "del", "dev", self.dev, "classid", f"1:{minor:x}"],
                                 check=False)
        self.classes = {k: v for k, v in self.classes.items() if k not in minors}

    def set_rate(self, minor: int, rate_bps: float, ceil_bps: float | None = None, prio: int = 0) -> float:
        """Change a class's rate, ceiling and priority now; returns the seconds the netlink change took."""
        t0 = time.perf_counter()
        set_class(self.ipr, self.idx, minor, rate_bps, ceil_bps, prio, self.mtu)
        self.classes[minor] = max(int(rate_bps), MIN_RATE_BPS)
        return time.perf_counter() - t0

    def class_bytes(self) -> dict[int, int]:
        """Bytes sent per flow class so far (the per-flow throughput counters the figures use)."""
        out = {}
        ipr = self.ipr
        for msg in ipr.get_classes(index=self.idx):
            handle = msg["handle"]
            stats = msg.get_attr("TCA_STATS2")
            basic = stats.get_attr("TCA_STATS_BASIC") if stats else None
            out[handle & 0xFFFF] = basic["bytes"] if basic else 0
        return out

    def close(self) -> None:
        if self._ipr is not None:
            self._ipr.close()

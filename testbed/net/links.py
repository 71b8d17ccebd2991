"""The lowered network: every WAN link once, in real-world units, as both engines run it. The simulator's per-direction
link plans (testbed/plan/plan.py LinkPlan) and the emulator's links, delays and flow classes are read from it; nothing
downstream re-reads a link from the topology. A link that changes during a run carries its schedule (`changes`: the
state in force from each time on), which both engines replay (testbed/sim/linkchange.py WanSchedule). Built by
testbed/plan/network.py.

Ground floor: the standard library only."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.net.scale import EmulatedLink
from testbed.net.units import bytes_s_to_gbps

Pair = tuple[str, str]


@dataclass(frozen=True, slots=True)
class WanState:
    """What a link is from some time on (both directions)."""

    capacity_bytes_s: float  # bytes/s when up
    latency_s: float  # one way
    up: bool = True

    @property
    def gbps(self) -> float:
        return bytes_s_to_gbps(self.capacity_bytes_s)


@dataclass(frozen=True)
class NetLink:
    """A full-duplex WAN link; each direction has the full capacity. With a scale k, `window_bytes` and `turn_bytes`
    are what the emulated link really carries (k x its emulated window and HTB quantum), and `emulated` the link as
    the emulator builds it."""

    a: str
    b: str
    capacity_bytes_s: float
    latency_s: float  # one way
    window_bytes: float  # one TCP connection's
    turn_bytes: float  # a fair-shared link's round-robin turn
    emulated: EmulatedLink | None = None
    # a changing link's schedule: (seconds of training since the first iteration began, the state from then on),
    # the first at 0; empty when the link never changes
    changes: tuple[tuple[float, WanState], ...] = ()

    @property
    def between(self) -> Pair:
        return (self.a, self.b)

    @property
    def rtt_s(self) -> float:
        return 2 * self.latency_s


@dataclass(frozen=True)
class NetPlan:
    """Every WAN link of a topology, lowered once; `scale` is the emulation's k (None: simulated only)."""

    links: tuple[NetLink, ...]
    scale: float | None = None

    def link(self, a: str, b: str) -> NetLink:
        """The link between DCs a and b, in either order."""
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link
        raise KeyError(f"no WAN link between {a} and {b}")

    def emulated(self, a: str, b: str) -> EmulatedLink:
        """The link between a and b as the emulator builds it."""
        e = self.link(a, b).emulated
        if e is None:
            raise ValueError("this network was lowered without a scale: it is not emulated")
        return e

    def touching(self, dc: str) -> list[tuple[str, NetLink]]:
        """(peer DC, link) for every link of `dc`, in the topology's order."""
        return [(link.b if link.a == dc else link.a, link) for link in self.links if dc in (link.a, link.b)]

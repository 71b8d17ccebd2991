"""The emulation's scale k applied, in one place: a real-world link (bytes/s, a window in bytes) as the emulator builds
it (bits/s divided by k, a window of whole segments of the path, 64 KiB at least), and what that link is back in
real-world units (the window it really carries, its round robin's turn). Choosing k and its limits:
testbed/emu/scale.py.

Ground floor: the standard library only."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.net.units import bytes_s_to_bps
from testbed.net.wire import link_mtu, turn_bytes

MIN_WINDOW = 64 * 1024  # below this one TCP connection no longer behaves like one (MSS is ~9 KB)
MTU = 9000
TCP_HEADERS = 52  # IPv4 and TCP headers with the timestamp option
MSS = MTU - TCP_HEADERS  # TCP payload per jumbo packet


def link_mss(link_bps: float) -> int:
    """TCP payload per packet on an emulated WAN path whose link carries `link_bps` (bits/s)."""
    return link_mtu(link_bps) - TCP_HEADERS


def emulated_window(window_bytes: float, scale: float, mss: int = MSS) -> int:
    """A real-world window as one emulated connection carries it: divided by k, at least 64 KiB, and a whole
    number of segments of `mss` (a receiver advertises, and a sender fills, a window in whole segments; bench
    tcp_fidelity.py measured a 128 KiB clamp carrying 14 segments' worth)."""
    w = max(window_bytes / scale, MIN_WINDOW)
    return max(1, round(w / mss)) * mss


@dataclass(frozen=True)
class EmulatedLink:
    """One WAN link as the emulator builds it, in emulated units (real-world rates and windows over k)."""

    rate_bps: float  # the shaped rate, payload bits/s
    window_bytes: int  # one connection's window
    mtu: int  # the hosts' packet size towards the peer DC (net/wire.py link_mtu)
    mss: int
    latency_s: float  # one way, real (latencies are not scaled)
    scale: float

    @property
    def rtt_s(self) -> float:
        return 2 * self.latency_s

    @property
    def delay_ms(self) -> float:
        """The one-way delay netem or the delay line is given (ms, rounded where s -> ms is inexact)."""
        return round(self.latency_s * 1e3, 9)

    @property
    def capacity_bytes_s(self) -> float:
        return self.rate_bps / 8

    @property
    def real_window_bytes(self) -> float:
        """The window one emulated connection carries, in real-world bytes (k x its emulated window)."""
        return self.window_bytes * self.scale

    @property
    def real_turn_bytes(self) -> float:
        """A turn of the link's HTB round robin in real-world bytes (k x its quantum)."""
        return turn_bytes(self.rate_bps, self.scale)


def emulate_link(capacity_bytes_s: float, latency_s: float, window_bytes: float, scale: float) -> EmulatedLink:
    """A real-world link (capacity, one-way latency, one connection's window) at scale k."""
    rate = bytes_s_to_bps(capacity_bytes_s) / scale
    mss = link_mss(rate)
    return EmulatedLink(rate, emulated_window(window_bytes, scale, mss), link_mtu(rate), mss, latency_s, scale)

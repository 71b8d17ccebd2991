"""The per-flow HTB classes' parameters and the one netlink change the Atlas sidecar makes to them.

The emulator's builder (emu/flowctl.py) creates the classes with these values; the sidecar, which
runs in the WAN node's own namespace (and image), only changes a class's rate and priority.
The arithmetic behind the values (frames, MTU, quantum, rates) is testbed/net/wire.py's, re-exported here.
Standard library only; `set_class` takes the caller's pyroute2 IPRoute, `ClassChanger` speaks netlink
itself (the sidecar's hot path)."""

from __future__ import annotations

import os
import socket
import struct

from testbed.net.wire import (  # noqa: F401 (re-exported: the HTB classes' parameters live in net/wire.py)
    ALLREDUCE_MINOR,
    ALLREDUCE_TOS,
    FRAME_BYTES,
    FULL_FRAME_BPS,
    GSO_SEGMENTS,
    IDLE_PRIO,
    JUMBO_MTU,
    KV_PRIO,
    MIN_MTU,
    MIN_RATE_BPS,
    PAYLOAD_BYTES,
    burst_bytes,
    kv_class,
    link_mtu,
    link_quantum,
    mtu_quantum,
    trickle_bps,
    turn_bytes,
    wire_bps,
    wire_rates,
)


def class_args(rate_bps: float, ceil_bps: float | None, prio: int, mtu: int) -> list[str]:
    """`tc class add|change ... htb` arguments of a class under 1:1 at payload rates (bits/s): what `set_class`
    and `ClassChanger` set over netlink. `mtu`: the path's (`link_mtu` of the rate the link was built at, its hosts'
    packet size, whatever the rate is now), which sets the wire rate's headers and the quantum."""
    rate, ceil = wire_rates(rate_bps, ceil_bps, mtu)
    return ["rate", f"{rate}bit", "ceil", f"{ceil}bit", "burst", str(burst_bytes(mtu)), "cburst",
            str(burst_bytes(mtu)), "prio", str(prio), "quantum", str(mtu_quantum(mtu))]


def set_class(ipr, idx: int, minor: int, rate_bps: float, ceil_bps: float | None, prio: int, mtu: int) -> None:
    """One netlink change of an HTB class (pyroute2 replaces the whole class: pass everything); rates in
    payload bits/s."""
    rate, ceil = wire_rates(rate_bps, ceil_bps, mtu)
    ipr.tc("change-class", "htb", idx, handle=f"1:{minor:x}", parent="1:1", rate=f"{rate}bit", ceil=f"{ceil}bit",
           burst=burst_bytes(mtu), cburst=burst_bytes(mtu), prio=prio, quantum=mtu_quantum(mtu))


RTM_NEWTCLASS, NLM_F_REQUEST, NLM_F_ACK, NLMSG_ERROR = 40, 1, 4, 2
TCA_KIND, TCA_OPTIONS, TCA_HTB_PARMS, TCA_HTB_RATE64, TCA_HTB_CEIL64 = 1, 2, 1, 6, 7
TC_LINKLAYER_ETHERNET = 1  # with a link layer set, the kernel needs no rate tables
PSCHED_TICK_NS = 64  # the kernel's psched tick (PSCHED_SHIFT 6)
NLA_F_NESTED = 1 << 15


def _attr(atype: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, atype) + payload + b"\0" * (-n % 4)


def _ratespec(bytes_per_s: int) -> bytes:
    return struct.pack("=BBHhHI", 0, TC_LINKLAYER_ETHERNET, 0, 0, 0, min(bytes_per_s, 2**32 - 1))


def change_message(ifindex: int, minor: int, rate_bps: float, ceil_bps: float, prio: int, mtu: int,
                   seq: int = 0) -> bytes:
    """An RTM_NEWTCLASS request changing HTB class 1:<minor> under 1:1: the values `set_class` sets, encoded as
    `tc` would (rates in payload bits/s; no rate tables, as the kernel computes rates itself)."""
    rate, ceil = (bits // 8 for bits in wire_rates(rate_bps, ceil_bps, mtu))  # bytes/s, as the kernel takes them
    buffer = burst_bytes(mtu) * 10**9 // rate // PSCHED_TICK_NS
    cbuffer = burst_bytes(mtu) * 10**9 // ceil // PSCHED_TICK_NS
    parms = _ratespec(rate) + _ratespec(ceil) + struct.pack("=IIIII", min(buffer, 2**32 - 1),
                                                             min(cbuffer, 2**32 - 1), mtu_quantum(mtu), 0, prio)
    opts = _attr(TCA_HTB_PARMS, parms)
    if rate >= 2**32:
        opts += _attr(TCA_HTB_RATE64, struct.pack("=Q", rate))
    if ceil >= 2**32:
        opts += _attr(TCA_HTB_CEIL64, struct.pack("=Q", ceil))
    body = struct.pack("=BBHiIII", socket.AF_UNSPEC, 0, 0, ifindex, 0x10000 | minor, 0x10001, 0)
    body += _attr(TCA_KIND, b"htb\0") + _attr(TCA_OPTIONS | NLA_F_NESTED, opts)
    return struct.pack("=IHHII", 16 + len(body), RTM_NEWTCLASS, NLM_F_REQUEST | NLM_F_ACK, seq, 0) + body


class ClassChanger:
    """HTB class changes over this namespace's own netlink socket, each request encoded once and replayed: the
    sidecar's reaction to a notice is then one system call (pyroute2 took 2 ms per change idle, 6-9 ms on a
    busy machine, computing rate tables in Python, and notices queued behind it: docs/fidelity.md)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self.cache: dict[tuple, bytes] = {}

    def set(self, ifindex: int, minor: int, rate_bps: float, ceil_bps: float, prio: int, mtu: int) -> None:
        key = (ifindex, minor, rate_bps, ceil_bps, prio, mtu)
        msg = self.cache.get(key)
        if msg is None:
            msg = self.cache[key] = change_message(ifindex, minor, rate_bps, ceil_bps, prio, mtu)
        self.sock.send(msg)
        reply = self.sock.recv(65536)
        if struct.unpack_from("=H", reply, 4)[0] == NLMSG_ERROR:
            err = struct.unpack_from("=i", reply, 16)[0]
            if err:
                raise OSError(-err, f"changing HTB class 1:{minor:x}: {os.strerror(-err)}")

    def close(self) -> None:
        self.sock.close()

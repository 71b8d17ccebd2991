"""Packet headers -> per-flow bytes per millisecond, and who had a WAN link when. Pure: unit-tested.

A captured packet's timestamp is the moment the shaped WAN egress handed it to the wire. Packets
are TSO/GSO aggregates of up to tens of kilobytes here (about 18 KB, 0.7 ms at 200 Mbit/s), so
counting each at its timestamp makes 1 ms bins lumpy: a bin holds one packet or two whatever the
sharing. `spread` instead puts a packet's bytes on the wire time it took at the link's rate,
ending at its timestamp (what a serialising link of that rate would have carried), so a 1 ms bin
shows the real mix of flows.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

BIN_S = 1e-3
ETHERNET_HEADER = 14


@dataclass(frozen=True)
class FlowKey:
    """One direction of one TCP connection on one WAN egress."""

    link: str  # "a-b", as the topology names the link
    towards: str  # the DC this egress leads to
    src: str
    sport: int
    dst: str
    dport: int


def spread(t_end_s: float, nbytes: int, rate_bps: float) -> list[tuple[int, float]]:
    """(1 ms bin index, bytes) of a packet whose last bit left at t_end_s on a link of rate_bps."""
    dur = nbytes * 8 / rate_bps if rate_bps > 0 else 0.0
    t0 = t_end_s - dur
    first, last = math.floor(t0 / BIN_S), math.floor(t_end_s / BIN_S)
    if first == last or dur <= 0:
        return [(last, float(nbytes))]
    out = []
    for b in range(first, last + 1):
        lo, hi = max(t0, b * BIN_S), min(t_end_s, (b + 1) * BIN_S)
        if hi > lo:
            out.append((b, nbytes * (hi - lo) / dur))
    return out


class FlowBins:
    """Bytes per (flow, 1 ms bin), and packets counted in the bin of their timestamp."""

    def __init__(self) -> None:
        self.bytes: dict[tuple[FlowKey, int], float] = defaultdict(float)
        self.packets: dict[tuple[FlowKey, int], int] = defaultdict(int)
        self.count = 0

    def add(self, key: FlowKey, t_s: float, nbytes: int, rate_bps: float) -> None:
        self.count += 1
        for b, v in spread(t_s, nbytes, rate_bps):
            self.bytes[(key, b)] += v
        self.packets[(key, math.floor(t_s / BIN_S))] += 1

    def rows(self) -> list[tuple[FlowKey, int, float, int]]:
        """(flow, bin, bytes, packets), sorted by bin then flow."""
        keys = set(self.bytes) | set(self.packets)
        return sorted(((k, b, self.bytes.get((k, b), 0.0), self.packets.get((k, b), 0)) for k, b in keys),
                      key=lambda x: (x[1], x[0].link, x[0].towards, x[0].src, x[0].sport, x[0].dst, x[0].dport))


@dataclass(frozen=True)
class Endpoint:
    """What an (address, port) of the emulated network is: its DC, and the replica or rank behind it."""

    dc: str = ""
    replica: str = ""  # a pipeline replica (our workers) or a host's replica index (foreign jobs)
    rank: str = ""  # a worker (s<stage>r<replica>) or torch ranks ("3" or "2|3" for a shared host)


Labeller = Callable[[str, int], Endpoint]

FLOWS_HEADER = ("run_id", "link", "towards", "t_ms", "src", "sport", "dst", "dport", "src_dc", "dst_dc", "replica",
                "rank", "bytes", "packets")


def flow_rows(run_id: str, rows: Iterable[tuple[FlowKey, int, float, int]], label: Labeller,
              t0_bin: int) -> list[tuple]:
    """flows.csv rows: bins relative to t0_bin; each flow labelled from whichever end is known (the
    receiving end first: a data flow's replica is its receiver's)."""
    out = []
    for k, b, nbytes, pkts in rows:
        s, d = label(k.src, k.sport), label(k.dst, k.dport)
        out.append((run_id, k.link, k.towards, b - t0_bin, k.src, k.sport, k.dst, k.dport, s.dc, d.dc,
                    d.replica or s.replica, d.rank or s.rank, round(nbytes, 1), pkts))
    return out


def pending_bins(transfers: Iterable[tuple[str, object, float, float]]) -> dict[int, frozenset]:
    """1 ms bins fully inside each transfer (replica, transfer id, start_s, end_s) -> the set of
    (replica, transfer id) pending there."""
    out: dict[int, set] = defaultdict(set)
    for r, tid, a, b in transfers:
        for k in range(math.ceil(a / BIN_S), math.floor(b / BIN_S)):
            out[k].add((r, tid))
    return {k: frozenset(v) for k, v in out.items()}


def contention(pending: dict[int, frozenset]) -> list[list[int]]:
    """Maximal runs of consecutive bins in which two or more replicas have a transfer pending and the set
    of pending transfers does not change: whoever should hold the link stays the same within one."""
    out: list[list[int]] = []
    prev = None
    for b in sorted(pending):
        who = pending[b]
        if len({r for r, _ in who}) < 2:
            prev = None
            continue
        if prev is not None and out and out[-1][-1] == b - 1 and who == prev:
            out[-1].append(b)
        else:
            out.append([b])
        prev = who
    return out


def leader_shares(bytes_by_replica: dict[int, dict[str, float]], pending: dict[int, frozenset],
                  min_bytes: float = 0.0) -> list[float]:
    """In each run of contention (see `contention`) the leader is the replica that carried most of the run's
    bytes; returns, for every bin of every run that carried bytes, the leader's share of the bin. Taking
    turns keeps it near 1 in every bin; sharing, even a FIFO that alternates bursts of each replica, hands
    many bins to the other replica. `min_bytes`: only bins in which the link carried at least this much
    (a busy link: both replicas had packets queued, so priority, not supply, decided who sent)."""
    out = []
    for run in contention(pending):
        tot: dict[str, float] = defaultdict(float)
        for b in run:
            for r, v in bytes_by_replica.get(b, {}).items():
                tot[r] += v
        if not tot:
            continue
        lead = max(tot, key=tot.__getitem__)
        for b in run:
            per = bytes_by_replica.get(b, {})
            total = sum(per.values())
            if total > 0 and total >= min_bytes:
                out.append(per.get(lead, 0.0) / total)
    return out

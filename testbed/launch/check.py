"""`testbed launch --check`: a foreign job's WAN transfers, as captured, against the simulator's model of
the same transfers on the emulated links.

Matching (pure): the capture's flows.csv has, per WAN link direction, the bytes each connection delivered
in each millisecond. On one direction the bytes between one pair of hosts form a transfer while they keep
coming; a silence longer than the link's round trip (plus a millisecond of binning) ends it, since a
window-bound transfer falls silent for less than a round trip between windows. A transfer has its bytes,
its first and last millisecond and the connections that carried it. Transfers closer than a round trip
are one transfer to the check; transfers under MIN_BYTES are left out (rendezvous, control messages), and so
are milliseconds whose packets carry headers only (acknowledgements of the opposite direction's transfer on
the same connection).

Model: the transfers of one link direction are replayed in start order on the simulator's network model:
each transfer is a pipe whose connections keep at most n x W unacknowledged (testbed.sim.executor.
SlidingWindow, W the emulated window), its pieces are flows on the link (testbed.sim.network.LinkState,
fair sharing at the emulated rate, or with `--sharing temporal` the launch's fixed turns: the receiving host's
index in its DC first) alongside the direction's other transfers. Its modelled duration is from
its start until its last byte leaves; the captured one is from its first to its last millisecond at the
far end of the link (latency cancels). error = captured / modelled - 1.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from testbed.sim.executor import SlidingWindow
from testbed.sim.network import Flow, LinkState

MIN_BYTES = 256 * 1024
HEADER_ONLY_BYTES = 128  # a millisecond whose packets average this or less carried acknowledgements only
BIN_MS = 1.0


@dataclass
class Transfer:
    link: str  # "a-b", as flows.csv names it
    towards: str  # the DC the bytes head into
    src: str
    dst: str
    start_ms: float  # its first millisecond (the bin's start)
    end_ms: float  # the end of its last millisecond
    nbytes: float
    connections: int
    model_s: float = field(default=math.nan)

    @property
    def measured_s(self) -> float:
        return (self.end_ms - self.start_ms) / 1e3

    @property
    def error(self) -> float:
        return self.measured_s / self.model_s - 1 if self.model_s > 0 else math.nan


def match_transfers(rows: list[dict], rtt_ms: dict[str, float], min_bytes: float = MIN_BYTES) -> list[Transfer]:
    """flows.csv rows (dicts) -> the transfers on each link direction, in start order. `rtt_ms`: link -> its
    round trip, which sets the silence that ends a transfer."""
    bins: dict[tuple, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    conns: dict[tuple, dict[int, set]] = defaultdict(lambda: defaultdict(set))
    for r in rows:
        b, n = float(r["bytes"]), int(float(r["packets"] or 0))
        if b <= 0 or (n and b / n <= HEADER_ONLY_BYTES):
            continue  # acknowledgements of the other direction's transfer (gloo's connections carry both)
        key = (r["link"], r["towards"], r["src"], r["dst"])
        t = int(float(r["t_ms"]))
        bins[key][t] += b
        conns[key][t].add((r["sport"], r["dport"]))
    out = []
    for key, series in bins.items():
        gap = rtt_ms[key[0]] + BIN_MS
        times = sorted(series)
        span = [times[0]]  # the milliseconds of the transfer being gathered
        for t in [*times[1:], math.inf]:
            if t - span[-1] > gap:
                nbytes = sum(series[u] for u in span)
                if nbytes >= min_bytes:
                    used = set().union(*(conns[key][u] for u in span))
                    out.append(Transfer(key[0], key[1], key[2], key[3], span[0], span[-1] + BIN_MS, nbytes, len(used)))
                span = []
            span.append(t)
    out.sort(key=lambda x: (x.link, x.towards, x.start_ms))
    return out


def replay(transfers: list[Transfer], capacity_bytes_s: float, window_bytes: float, rtt_s: float,
           prio: dict[str, int] | None = None) -> None:
    """Set each transfer's `model_s`: the transfers of ONE link direction, replayed together on the simulator's
    network model from their captured starts. `prio` (receiving host address -> priority, lower first) replays
    temporal sharing (`--sharing temporal`: one HTB class per receiving host); without it the link is fair."""
    events: list[tuple] = []  # (t, seq, fn, args)
    seq = [0]

    def push(t: float, fn, *args) -> None:
        seq[0] += 1
        heapq.heappush(events, (t, seq[0], fn, args))

    def done(flow: Flow, version: int) -> None:
        if version != flow.version:
            return
        i = flow.payload
        link.remove(flow, now[0])
        wins[i].ended(now[0])
        left[i] -= flow.nbytes
        if left[i] > transfers[i].nbytes * 1e-9:
            send(i)
        else:
            transfers[i].model_s = now[0] - transfers[i].start_ms / 1e3

    def send(i: int) -> None:
        budget = wins[i].budget(now[0])
        if budget <= left[i] * 1e-12:
            push(wins[i].next_free_s(), send, i)
            return
        flow = Flow(min(left[i], budget), math.inf, (prio.get(transfers[i].dst, 0),) if prio else (), i)
        wins[i].sent(now[0], flow.nbytes)
        link.add(flow, now[0])

    now = [0.0]
    link = LinkState(capacity_bytes_s, bool(prio), lambda t, f, v: push(t, done, f, v))
    wins = [SlidingWindow(x.connections * window_bytes, rtt_s) for x in transfers]
    left = [x.nbytes for x in transfers]
    for i, x in enumerate(transfers):
        push(x.start_ms / 1e3, send, i)
    while events:
        t, _, fn, args = heapq.heappop(events)
        now[0] = t
        fn(*args)


@dataclass(frozen=True)
class LinkCheck:
    link: str
    towards: str
    transfers: int
    median_error: float
    worst_error: float  # the largest in magnitude, signed
    mbytes: float

    def row(self) -> tuple:
        return (self.link, self.towards, self.transfers, round(self.mbytes, 3), round(self.median_error, 4),
                round(self.worst_error, 4))


CHECK_HEADER = ("link", "towards", "transfers", "mbytes", "median_error", "worst_error")


def check(rows: list[dict], links: dict[str, tuple[float, float, float]], min_bytes: float = MIN_BYTES,
          prio: dict[str, int] | None = None) -> tuple[list[LinkCheck], list[Transfer]]:
    """Per link direction, the captured transfers' errors against the model. `links`: flows.csv's link name ->
    (emulated capacity bytes/s, emulated window bytes per connection, round trip s); `prio` as for `replay`."""
    transfers = match_transfers(rows, {k: v[2] * 1e3 for k, v in links.items()}, min_bytes)
    by_dir: dict[tuple[str, str], list[Transfer]] = defaultdict(list)
    for x in transfers:
        by_dir[(x.link, x.towards)].append(x)
    out = []
    for (name, towards), xs in sorted(by_dir.items()):
        cap, win, rtt = links[name]
        replay(xs, cap, win, rtt, prio)
        errs = [x.error for x in xs if math.isfinite(x.error)]
        if errs:
            out.append(LinkCheck(name, towards, len(errs), statistics.median(errs), max(errs, key=abs),
                                 sum(x.nbytes for x in xs) / 1e6))
    return out, transfers

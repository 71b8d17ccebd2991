"""Topology spec: datacenters (GPUs, intra-DC network) and the WAN links between them."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed.costs.gpus import GPUS
from testbed.spec.bounds import (
    DC_GPUS,
    GPUS_PER_NODE,
    INTRA_GBPS,
    INTRA_LATENCY_US,
    LABEL,
    LATENCY_MS,
    TURN_BYTES,
    WAN_GBPS,
    WINDOW_MB,
    real,
)

SAFE_NAME = re.compile(r"^[a-z][a-z0-9]{0,11}$")
# Interfaces a fresh network namespace may already hold (loopback and the kernel's fallback tunnel
# devices, when their modules are loaded): the emulator names a WAN node's interfaces after its DCs.
RESERVED_NAMES = ("lo", "tunl0", "sit0", "gre0", "gretap0", "erspan0", "ip6tnl0", "ip6gre0")
# net.ipv4.tcp_rmem max on stock Linux kernels (6 MiB): what one untuned TCP connection can keep in flight.
DEFAULT_WINDOW_MB = 6.0
# A changing link (testbed/sim/linkchange.py): a schedule of at most 100,000 points; rates and latencies have the
# link's own bounds (spec/bounds.py).
MAX_TRACE_POINTS = 100_000
SCHEDULE_S = real(0, 7 * 86400, "s", "seconds of training from the first iteration; a week at most")
OUTAGE_S = real(0, 86400, "s", "a day at most", lo_open=True)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DC(Strict):
    """One datacenter: a pool of identical GPUs behind a non-blocking fabric."""

    name: str
    gpu: str = "H100"
    gpus: DC_GPUS
    gpus_per_node: GPUS_PER_NODE = 8
    intra_gbps: INTRA_GBPS = 400.0  # per GPU: one NIC per GPU (e.g. 400G InfiniBand NDR)
    intra_latency_us: INTRA_LATENCY_US = 5.0
    hosts: Annotated[int, Field(gt=0, le=16)] = 2  # emulated hosts in this DC (emulation only)

    @field_validator("name")
    @classmethod
    def _safe(cls, v: str) -> str:
        if not SAFE_NAME.match(v):
            raise ValueError(f"{v!r} is not a safe name; use 1-12 lowercase letters/digits starting with a letter")
        if v in RESERVED_NAMES:
            raise ValueError(f"{v!r} is the name of a kernel network interface; pick another name")
        return v

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, v: str) -> str:
        up = v.upper()  # GPUS: the zoo plus any GPU registered from costs.gpus
        if up not in GPUS:
            raise ValueError(f"unknown GPU {v!r}; use one of {', '.join(GPUS)}, or describe it under costs.gpus")
        return up


class TracePoint(Strict):
    """From `t_s` seconds into the run on, the link carries `gbps` (each direction) with `latency_ms` one way."""

    t_s: SCHEDULE_S
    gbps: WAN_GBPS
    latency_ms: LATENCY_MS


class LinkOutage(Strict):
    """The link carries nothing, either way, from `at_s` for `down_for_s` seconds; then it is back."""

    at_s: SCHEDULE_S
    down_for_s: OUTAGE_S


class Circuit(Strict):
    """One of a DC pair's circuits (say one of two 400 Gbit/s waves): its own capacity and one-way latency, and
    outages that take only it down."""

    gbps: WAN_GBPS
    latency_ms: LATENCY_MS
    events: Annotated[list[LinkOutage], Field(max_length=MAX_TRACE_POINTS)] = []


def bundle(circuits: list[Circuit]) -> dict[str, Any]:
    """A pair's circuits as one link: a transfer is striped over the circuits that are up in proportion to their
    capacity, so the pair carries their summed rate and a transfer is complete when the farthest circuit's share
    arrives (their largest latency). An outage of one circuit is a step of the link's trace; of all of them at once,
    an outage of the link. Returns the link's gbps, latency_ms, trace (None: never changes) and events."""
    if sum(len(c.events) for c in circuits) > MAX_TRACE_POINTS // 2:
        raise ValueError(f"circuits: more than {MAX_TRACE_POINTS // 2:,} outages in all; keep them to that")
    flips: dict[float, list[tuple[int, int]]] = {}  # time -> (circuit, +1 an outage begins / -1 one ends)
    for i, c in enumerate(circuits):
        for e in c.events:
            flips.setdefault(e.at_s, []).append((i, 1))
            flips.setdefault(e.at_s + e.down_for_s, []).append((i, -1))
    by_latency = sorted(range(len(circuits)), key=lambda i: -circuits[i].latency_ms)
    down = [0] * len(circuits)  # outages in force per circuit (its own may overlap)
    nominal = (sum(c.gbps for c in circuits), circuits[by_latency[0]].latency_ms)
    trace: list[dict[str, float]] = []
    events: list[dict[str, float]] = []
    last, all_down_at = nominal, None
    for t in sorted(flips):  # one pass over the times anything changes
        for i, d in flips[t]:
            down[i] += d
        up_gbps = sum(c.gbps for c, n in zip(circuits, down, strict=True) if n == 0)
        if up_gbps == 0:  # every circuit down: an outage of the link until the first comes back
            all_down_at = t if all_down_at is None else all_down_at
            continue
        if all_down_at is not None:
            events.append({"at_s": all_down_at, "down_for_s": t - all_down_at})
            all_down_at = None
        st = (up_gbps, next(circuits[i].latency_ms for i in by_latency if down[i] == 0))
        if st != last:
            trace.append({"t_s": t, "gbps": st[0], "latency_ms": st[1]})
            last = st
    return {"gbps": nominal[0], "latency_ms": nominal[1], "trace": trace or None, "events": events}


def read_trace(path: str) -> list[dict[str, Any]]:
    """A link trace CSV (header `t_s,gbps,latency_ms`) as rows; a bad file is one ValueError naming the line."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise ValueError(f"cannot read trace file {path!r} ({e.strerror}); give a CSV of t_s,gbps,latency_ms"
                         ) from None
    rows = [r for r in rows if r and not r[0].lstrip().startswith("#")]
    want = ["t_s", "gbps", "latency_ms"]
    if not rows or [c.strip() for c in rows[0]] != want:
        raise ValueError(f"{Path(path).name} must start with the header line t_s,gbps,latency_ms")
    if len(rows) - 1 > MAX_TRACE_POINTS:
        raise ValueError(f"{Path(path).name} has {len(rows) - 1} points; keep it to {MAX_TRACE_POINTS}")
    out = []
    for i, r in enumerate(rows[1:], start=2):
        try:
            t, g, lat = (float(x) for x in r)
        except ValueError:
            raise ValueError(f"{Path(path).name} line {i}: expected three numbers t_s,gbps,latency_ms, got {r}"
                             ) from None
        out.append({"t_s": t, "gbps": g, "latency_ms": lat})
    return out


class WanLink(Strict):
    """A full-duplex WAN link between two DCs; each direction has the full capacity.

    It may change during a run: `trace` (a CSV of t_s,gbps,latency_ms, or the points inline) sets its rate and
    latency from each point's time on; `events` take it down for a while. `gbps` and `latency_ms` hold until the
    first trace point."""

    between: tuple[str, str]
    gbps: WAN_GBPS
    latency_ms: LATENCY_MS
    tcp_window_mb: WINDOW_MB | None = None
    # Where replicas share this link fairly, the wire serves them in turns of this many bytes (round robin), and a
    # turn is how far apart symmetric replicas' first transfers get it (testbed/sim/executor.py round_robin_lags).
    # None: one 9014-byte jumbo frame, a real link's turn. The emulator's turn, in real-world bytes, is k times its
    # HTB quantum (testbed/plan/network.py lower_network, for the simulator's prediction of an emulated run).
    round_robin_bytes: TURN_BYTES | None = None
    trace: Annotated[list[TracePoint], Field(min_length=1, max_length=MAX_TRACE_POINTS)] | None = None
    events: Annotated[list[LinkOutage], Field(max_length=MAX_TRACE_POINTS)] = []
    # several circuits between the pair, each with its own capacity, latency and outages: the link's gbps,
    # latency_ms, trace and events are derived from them (`bundle`)
    circuits: Annotated[list[Circuit], Field(min_length=2, max_length=64)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _bundle(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("circuits"):
            return data
        if not isinstance(data["circuits"], list):
            return data  # the field's own validation names it
        circuits = [c if isinstance(c, Circuit) else Circuit.model_validate(c) for c in data["circuits"]]
        derived = bundle(circuits)
        for key, want in derived.items():
            have = data.get(key)
            if have in (None, []) or _plain(have) == _plain(want):
                continue  # absent, or what the circuits give (a run's spec.yaml read back)
            raise ValueError(f"{key}: set by the link's circuits (gbps their sum, latency_ms their largest, trace "
                             "and events their outages); drop it, or change the circuits "
                             "(e.g. topology.links.0.circuits.*.gbps)")
        return {**data, **derived, "circuits": circuits}

    @field_validator("trace", mode="before")
    @classmethod
    def _read(cls, v: Any) -> Any:
        return read_trace(v) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _distinct(self) -> WanLink:
        if self.between[0] == self.between[1]:
            raise ValueError("a link joins two different DCs; name two distinct DCs in 'between'")
        for i, (p, q) in enumerate(zip(self.trace or [], (self.trace or [])[1:], strict=False)):
            if q.t_s <= p.t_s:
                raise ValueError(f"trace.{i + 1}.t_s: {q.t_s:g} does not come after {p.t_s:g}; "
                                 f"list the points in increasing time")
        for i, (p, q) in enumerate(zip(self.events, self.events[1:], strict=False)):
            if q.at_s < p.at_s + p.down_for_s:
                raise ValueError(f"events.{i + 1}.at_s: {q.at_s:g} is before the outage at {p.at_s:g} s is over; "
                                 f"list outages in time order without overlap")
        return self

    @property
    def changes(self) -> bool:
        return bool(self.trace or self.events)


def _plain(v: Any) -> Any:
    """A spec value as plain data (models dumped, numbers as floats) so derived and given values compare."""
    if isinstance(v, BaseModel):
        return _plain(v.model_dump())
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


class Topology(Strict):
    name: LABEL = "topology"
    tcp_window_mb: WINDOW_MB = DEFAULT_WINDOW_MB
    dcs: Annotated[list[DC], Field(min_length=1)]
    links: list[WanLink] = []

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        names = [d.name for d in self.dcs]
        seen: set[str] = set()
        for i, n in enumerate(names):
            if n in seen:
                raise ValueError(f"dcs[{i}].name: duplicate DC name {n!r}; give every DC its own name")
            seen.add(n)
        pairs: set[frozenset[str]] = set()
        for i, link in enumerate(self.links):
            for end in link.between:
                if end not in seen:
                    raise ValueError(
                        f"links[{i}].between: unknown DC {end!r}; use one of {', '.join(names)}"
                    )
            key = frozenset(link.between)
            if key in pairs:
                raise ValueError(f"links[{i}].between: a second link between {sorted(key)}; list a pair's "
                                 "circuits under one link's `circuits:` (each with its gbps, latency_ms and events)")
            pairs.add(key)
        return self

    def dc(self, name: str) -> DC:
        for d in self.dcs:
            if d.name == name:
                return d
        raise KeyError(name)

    def link(self, a: str, b: str) -> WanLink | None:
        for link in self.links:
            if set(link.between) == {a, b}:
                return link
        return None

    def window_mb(self, link: WanLink) -> float:
        return link.tcp_window_mb if link.tcp_window_mb is not None else self.tcp_window_mb

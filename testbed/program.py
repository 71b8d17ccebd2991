"""Lowered programs: what one GPU group (the tp GPUs of one stage of one replica) does in one
iteration, as a list of typed steps, the way torch.distributed.pipelining lowers a schedule into
per-rank actions with explicit communication.

plan/lower.py turns a Plan into one Program per group; the simulator (sim/executor.py) and the
emulated workers (runtime/worker.py) execute the same programs, so a decision (which peer, how many
bytes over how many connections, which port, which all-reduce) is made once, there.

Plain data and the standard library only: workers import this in images without the testbed's
dependencies. Programs travel to workers as JSON (`to_json`/`from_json`, validated on the way in).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Literal

Kind = Literal["a", "g"]  # an activation (towards the next stage) or its gradient (towards the previous)


@dataclass(frozen=True)
class Forward:
    microbatch: int
    seconds: float  # the cost model's time (modeled compute)
    chunk: int = 0  # which of the group's model chunks (virtual stages; 0 without interleaving)


@dataclass(frozen=True)
class Backward:
    microbatch: int
    seconds: float
    chunk: int = 0


@dataclass(frozen=True)
class BackwardWeight:
    """The weight-gradient half of a backward, which the zero-bubble schedule runs apart from (after) its
    Backward (then the input-gradient half): nothing waits for it but the all-reduce."""

    microbatch: int
    seconds: float
    chunk: int = 0


@dataclass(frozen=True)
class Send:
    """Queue a message on the pipe to `peer`; the program goes on while it leaves."""

    kind: Kind
    microbatch: int
    peer: str  # group name, s<stage>r<replica>
    bytes: float  # real-world bytes (an emulation divides them by its scale)
    chunk: int = 0  # the receiving group's model chunk that consumes it (virtual stages)


@dataclass(frozen=True)
class Recv:
    """Wait until the message from `peer` has arrived."""

    kind: Kind
    microbatch: int
    peer: str
    bytes: float
    chunk: int = 0  # this group's model chunk that consumes it


@dataclass(frozen=True)
class Exchange:
    """One step of an all-reduce: send `bytes` to `send_to` while receiving as many from `recv_from`."""

    send_to: str
    recv_from: str
    bytes: float


@dataclass(frozen=True)
class AllReduce:
    """The data-parallel gradient all-reduce of this group's stage, after its last backward.

    `rings` holds the stage's groups per DC (topology order, one tuple when they share a DC). `ring`:
    reduce-scatter then all-gather around them all. `hierarchical` (replicas in several DCs): a
    reduce-scatter inside each DC, a ring across DCs over the WAN among the groups holding the same
    shard, then an all-gather inside each DC. `exchanges()` spells out one group's part."""

    algorithm: Literal["ring", "hierarchical"]
    bytes: float  # the stage's gradient bytes per group
    rings: tuple[tuple[str, ...], ...]  # shared by every group of the stage
    wan_connections: tuple[int, ...] = ()  # per DC: the TCP connections its share of the ring across DCs uses
    wan_window_bytes: tuple[float, ...] = ()  # per DC: the TCP window of the link to the next DC of the ring


def exchanges(ar: AllReduce, group: str) -> list[Exchange]:
    """`group`'s exchanges in the all-reduce, in order (each sends to one peer while receiving from one)."""
    G = ar.bytes
    if ar.algorithm == "ring":
        ring = [g for r in ar.rings for g in r]
        n, me = len(ring), ring.index(group)
        if n < 2:
            return []
        return [Exchange(ring[(me + 1) % n], ring[(me - 1) % n], G / n)] * (2 * (n - 1))
    k = next(i for i, r in enumerate(ar.rings) if group in r)
    local, D = ar.rings[k], len(ar.rings)
    j, n = local.index(group), len(local)
    nxt, prv = ar.rings[(k + 1) % D], ar.rings[(k - 1) % D]
    inside = [Exchange(local[(j + 1) % n], local[(j - 1) % n], G / n)] * (n - 1)
    across = [Exchange(nxt[j % len(nxt)], prv[j % len(prv)], G / (n * D))] * (2 * (D - 1))
    return inside + across + inside


# --- Megatron-Core's distributed optimizer: bucketed collectives, each issued without waiting ---------------------
@dataclass(frozen=True)
class ReduceScatter:
    """Issue the reduce-scatter of gradient bucket `bucket` `after_s` into the compute step that follows (when
    that bucket's layers have finished the last microbatch's backward), and go on. A group's collectives run
    one at a time in issue order (one NCCL stream). `rings` as AllReduce's: one ring, or hierarchical (a
    reduce-scatter inside each DC, then a ring all-reduce of each shard across DCs over the WAN; the all-gather
    inside each DC is the parameters', AllGather)."""

    bucket: int
    after_s: float
    algorithm: Literal["ring", "hierarchical"]
    bytes: float  # the bucket's gradient bytes per group
    rings: tuple[tuple[str, ...], ...]
    wan_connections: tuple[int, ...] = ()
    wan_window_bytes: tuple[float, ...] = ()


@dataclass(frozen=True)
class AllGather:
    """Issue the all-gather of parameter bucket `bucket` (the optimizer's updated shards) among the groups of
    the ring in `rings` that holds this group (its DC's, or one ring of all), and go on."""

    bucket: int
    bytes: float
    rings: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Await:
    """Wait for `collective` of bucket `bucket`, except that the next compute may start `lead_s` before it
    ends (its first `lead_s` seconds do not need the bucket: earlier layers' parameters)."""

    collective: Literal["ReduceScatter", "AllGather"]
    bucket: int
    lead_s: float = 0.0


Bucketed = ReduceScatter | AllGather


def collective_exchanges(st: AllReduce | Bucketed, group: str) -> list[Exchange]:
    """`group`'s exchanges in an all-reduce (`exchanges`), in a bucket's reduce-scatter (the all-reduce's first
    half inside the DC and its part across DCs) or in a bucket's all-gather (its second half inside the DC)."""
    if isinstance(st, AllReduce):
        return exchanges(st, group)
    if isinstance(st, AllGather):
        ring = next(r for r in st.rings if group in r)
        n, me = len(ring), ring.index(group)
        return [Exchange(ring[(me + 1) % n], ring[(me - 1) % n], st.bytes / n)] * (n - 1)
    full = exchanges(AllReduce(st.algorithm, st.bytes, st.rings, st.wan_connections, st.wan_window_bytes), group)
    local = next(r for r in st.rings if group in r) if st.algorithm == "hierarchical" else [g for r in st.rings
                                                                                             for g in r]
    return full[:len(full) - (len(local) - 1)]


def await_slot(collective: str, bucket: int) -> int:
    """A collective's index among a group's bucketed collectives (all-gathers even, reduce-scatters odd)."""
    return 2 * bucket + (collective == "ReduceScatter")



@dataclass(frozen=True)
class Optimizer:
    """The inner optimizer step between two inner steps of low-communication training (testbed/plan/diloco.py);
    a synchronous family's single optimizer step follows its program instead."""

    seconds: float


@dataclass(frozen=True)
class OuterSync:
    """Start averaging fragment `fragment`'s outer gradient across DCs (DiLoCo's sync) and go on: hierarchical as
    AllReduce is (reduce-scatter inside the DC, a ring across DCs over the WAN, all-gather inside), `bytes` being
    the fragment's quantised outer gradient. OuterWait(fragment) waits for it to end."""

    fragment: int
    bytes: float
    rings: tuple[tuple[str, ...], ...]
    wan_connections: tuple[int, ...] = ()
    wan_window_bytes: tuple[float, ...] = ()

    def as_allreduce(self) -> AllReduce:
        """The exchanges it makes: those of a hierarchical all-reduce of its bytes (a ring with one DC)."""
        algo = "hierarchical" if len(self.rings) > 1 and self.wan_connections else "ring"
        return AllReduce(algo, self.bytes, self.rings, self.wan_connections, self.wan_window_bytes)


@dataclass(frozen=True)
class OuterWait:
    """Wait until fragment `fragment`'s OuterSync has ended."""

    fragment: int


def collectives(steps) -> list[AllReduce]:
    """The program's collectives as all-reduces (its AllReduce steps, and each OuterSync's exchanges), in order."""
    return [st if isinstance(st, AllReduce) else st.as_allreduce() for st in steps
            if isinstance(st, AllReduce | OuterSync)]


def ring_collectives(steps) -> list[AllReduce | ReduceScatter | AllGather]:
    """Every collective that runs over the ring connections, in order: the all-reduces (`collectives`) and the
    bucketed reduce-scatters and all-gathers; `collective_exchanges` spells out a group's part of each."""
    return [*collectives(steps), *(st for st in steps if isinstance(st, ReduceScatter | AllGather))]



Step = (Forward | Backward | BackwardWeight | Send | Recv | AllReduce | ReduceScatter | AllGather | Await | Optimizer
        | OuterSync | OuterWait)
STEPS: dict[str, type] = {t.__name__: t for t in (Forward, Backward, BackwardWeight, Send, Recv, AllReduce,
                                                   ReduceScatter, AllGather, Await, Optimizer, OuterSync, OuterWait)}


@dataclass(frozen=True)
class Pipe:
    """The TCP connections this group opens to `peer` and sends its messages on (one direction: the peer's
    messages come on the peer's own pipe). Successive messages queue on them in order: one FIFO with one window
    per connection."""

    peer: str
    connections: int
    wan: tuple[str, str] | None  # (from DC, to DC) when the pipe crosses the WAN
    port: int  # the peer's listening port, where these connections go
    # the replica whose class carries it across the WAN (replicas share a link fairly, or take turns under temporal
    # sharing); None inside a DC
    flow_class: int | None
    window_bytes: float = 0.0  # each connection's TCP window (real-world bytes) across the WAN; 0 inside a DC


@dataclass(frozen=True)
class Program:
    group: str  # s<stage>r<replica>
    stage: int
    replica: int
    dc: str
    host: int  # which of its DC's emulated hosts runs it
    port: int  # where it listens
    offset_s: float  # when it starts after the iteration's start (Atlas's stagger)
    steps: tuple[Step, ...]
    pipes: tuple[Pipe, ...]  # to each peer this group sends to, and from each peer it receives from

    def pipe(self, peer: str) -> Pipe:
        for p in self.pipes:
            if p.peer == peer:
                return p
        raise KeyError(f"{self.group} has no pipe to {peer}")

    def to_json(self) -> str:
        d = asdict(self)
        d["steps"] = [{"op": type(s).__name__, **asdict(s)} for s in self.steps]
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Program:
        return program_from_dict(json.loads(text))


class ProgramError(ValueError):
    """A malformed program (a corrupted or hand-edited config): the worker stops before it starts."""


def _typed(t: type, d: dict, where: str) -> object:
    names = {f.name: f for f in fields(t)}
    if set(d) != set(names):
        raise ProgramError(f"{where}: fields {sorted(d)} are not {sorted(names)}")
    out = {}
    for name, f in names.items():
        v = d[name]
        ann = str(f.type)
        if ann in ("int",) and not (isinstance(v, int) and not isinstance(v, bool)):
            raise ProgramError(f"{where}.{name}: {v!r} is not an integer")
        if ann == "float" and not isinstance(v, int | float):
            raise ProgramError(f"{where}.{name}: {v!r} is not a number")
        if ann in ("str", "Kind") and not isinstance(v, str):
            raise ProgramError(f"{where}.{name}: {v!r} is not a string")
        out[name] = v
    return t(**out)


def program_from_dict(d: dict) -> Program:
    if not isinstance(d, dict):
        raise ProgramError("a program is a JSON object")
    try:
        steps = []
        for i, s in enumerate(d["steps"]):
            op = s.pop("op", None)
            if op not in STEPS:
                raise ProgramError(f"steps[{i}]: unknown op {op!r}")
            if op in ("AllReduce", "ReduceScatter", "AllGather", "OuterSync"):
                s["rings"] = tuple(tuple(str(g) for g in r) for r in s["rings"])
            if op in ("AllReduce", "ReduceScatter", "OuterSync"):
                s["wan_connections"] = tuple(int(c) for c in s["wan_connections"])
                s["wan_window_bytes"] = tuple(float(w) for w in s["wan_window_bytes"])
            steps.append(_typed(STEPS[op], s, f"steps[{i}]"))
        pipes = tuple(Pipe(p["peer"], int(p["connections"]), tuple(p["wan"]) if p["wan"] else None, int(p["port"]),
                           p["flow_class"], float(p["window_bytes"])) for p in d["pipes"])
        return Program(str(d["group"]), int(d["stage"]), int(d["replica"]), str(d["dc"]), int(d["host"]),
                       int(d["port"]), float(d["offset_s"]), tuple(steps), pipes)
    except (KeyError, TypeError) as e:
        raise ProgramError(f"malformed program: {e!r}") from None

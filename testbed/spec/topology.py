"""Topology spec: datacenters (GPUs, intra-DC network) and the WAN links between them."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed.spec.bounds import (
    DC_GPUS,
    GPUS_PER_NODE,
    INTRA_GBPS,
    INTRA_LATENCY_US,
    LABEL,
    LATENCY_MS,
    WAN_GBPS,
    WINDOW_MB,
)

SAFE_NAME = re.compile(r"^[a-z][a-z0-9]{0,11}$")
# Interfaces a fresh network namespace may already hold (loopback and the kernel's fallback tunnel
# devices, when their modules are loaded): the emulator names a WAN node's interfaces after its DCs.
RESERVED_NAMES = ("lo", "tunl0", "sit0", "gre0", "gretap0", "erspan0", "ip6tnl0", "ip6gre0")
GPU_TYPES = ("A100", "H100", "H200")
# net.ipv4.tcp_rmem max on stock Linux kernels (6 MiB): what one untuned TCP connection can keep in flight.
DEFAULT_WINDOW_MB = 6.0


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
        up = v.upper()
        if up not in GPU_TYPES:
            raise ValueError(f"unknown GPU {v!r}; use one of {', '.join(GPU_TYPES)}")
        return up


class WanLink(Strict):
    """A full-duplex WAN link between two DCs; each direction has the full capacity."""

    between: tuple[str, str]
    gbps: WAN_GBPS
    latency_ms: LATENCY_MS
    tcp_window_mb: WINDOW_MB | None = None

    @model_validator(mode="after")
    def _distinct(self) -> WanLink:
        if self.between[0] == self.between[1]:
            raise ValueError("a link joins two different DCs; name two distinct DCs in 'between'")
        return self


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
                raise ValueError(f"links[{i}].between: a second link between {sorted(key)}; keep one per pair")
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

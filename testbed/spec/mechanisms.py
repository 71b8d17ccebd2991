"""Schedulers as compositions of mechanisms, so an ablation is one name: `pp-wan+mtcp`, `atlas-temporal`.

A name is a base followed by `+mechanism` (switch it on) or `-mechanism` (switch it off), applied left
to right. Every mechanism applies to every pipeline base, so each can be measured alone and together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

Placement = Literal["dp-wan", "pp-even", "atlas"]
Transport = Literal["nccl", "one"]
Outer = Literal["", "diloco", "streaming"]


@dataclass(frozen=True)
class Mechanisms:
    placement: Placement  # where stages and replicas go
    multi_tcp: bool  # stripe each WAN transfer over enough connections to cover the link's bandwidth-delay product
    temporal: bool  # replicas take turns on a WAN link at full rate instead of sharing it
    stagger: bool  # offset replica start times so their WAN phases interleave
    bubbletea: bool = False  # serve prefill requests inside pipeline bubbles
    warmup: bool = False  # 1F1B with extra warm-up microbatches ahead of WAN hops (memory permitting)
    # connections a stage boundary opens before multi-TCP: NCCL's sockets per TP rank ("nccl", as Megatron-LM
    # deploys it) or a single TCP connection for the whole boundary ("one")
    transport: Transport = "nccl"
    # Megatron-Core's distributed optimizer with overlap: gradients reduce-scattered in buckets while the backward
    # goes on, parameters all-gathered while the next forward starts (plan/buckets.py); off: one all-reduce after
    # the last backward
    overlap: bool = False
    # low-communication training: each DC trains its own replicas for H inner steps, then the DCs average the
    # outer gradient over the WAN ("diloco": the whole model at once; "streaming": fragments in turn, each sync
    # overlapping the next inner steps); "" = synchronous training
    outer: Outer = ""
    # mechanisms the plan decides per link and regime (plan/choose.py): the atlas base leaves it every one of
    # AUTO_ALL; a +/- modifier pins its own. The fields above are then the defaults the rules override.
    auto: frozenset[str] = frozenset()


AUTO_ALL = frozenset({"greedy", "mtcp", "temporal", "stagger", "warmup"})


BASES: dict[str, Mechanisms] = {
    "dp-wan": Mechanisms("dp-wan", multi_tcp=False, temporal=False, stagger=False, overlap=True),
    "pp-wan": Mechanisms("pp-even", multi_tcp=False, temporal=False, stagger=False),
    "pp-1tcp": Mechanisms("pp-even", multi_tcp=False, temporal=False, stagger=False, transport="one"),
    "atlas": Mechanisms("atlas", multi_tcp=True, temporal=True, stagger=True, warmup=True, auto=AUTO_ALL),
    "diloco": Mechanisms("dp-wan", multi_tcp=False, temporal=False, stagger=False, outer="diloco"),
    "streaming-diloco": Mechanisms("dp-wan", multi_tcp=False, temporal=False, stagger=False, outer="streaming"),
}
BASE_HELP = {
    "dp-wan": "whole pipelines inside each DC, Megatron-Core's distributed optimizer across DCs: bucketed gradient "
              "reduce-scatter overlapped with the backward, hierarchical over the WAN",
    "pp-wan": "Megatron-LM's pipeline across DCs over NCCL sockets (tp streams per boundary, NCCL's sockets each)",
    "pp-1tcp": "a pipeline across DCs over one TCP connection per stage boundary",
    "atlas": "Atlas: greedy placement, multi-TCP, temporal sharing with stagger, latency-aware warm-up, each used "
             "where the plan says it pays (plan/choose.py)",
    "diloco": "DiLoCo: whole pipelines inside each DC train H inner steps, then the outer gradient is averaged "
              "across DCs over the WAN",
    "streaming-diloco": "Streaming DiLoCo: DiLoCo whose model fragments sync in turn, overlapping inner steps, with "
                        "quantised outer gradients",
}
# (field values when switched on, field values when switched off)
MODIFIERS: dict[str, tuple[dict[str, object], dict[str, object]]] = {
    "mtcp": ({"multi_tcp": True}, {"multi_tcp": False}),
    "temporal": ({"temporal": True, "stagger": True}, {"temporal": False, "stagger": False}),
    "stagger": ({"stagger": True}, {"stagger": False}),
    "greedy": ({"placement": "atlas"}, {"placement": "pp-even"}),
    "warmup": ({"warmup": True}, {"warmup": False}),
    "bubbletea": ({"bubbletea": True}, {"bubbletea": False}),
    "overlap": ({"overlap": True}, {"overlap": False}),
}
# the mechanisms each modifier pins (takes away from the plan's choice)
PINS: dict[str, frozenset[str]] = {"mtcp": frozenset({"mtcp"}), "temporal": frozenset({"temporal", "stagger"}),
                                   "stagger": frozenset({"stagger"}), "greedy": frozenset({"greedy"}),
                                   "warmup": frozenset({"warmup"}), "bubbletea": frozenset(),
                                   "overlap": frozenset()}
_NAME = re.compile(r"^(?P<base>" + "|".join(map(re.escape, sorted(BASES, key=len, reverse=True)))
                   + r")(?P<mods>(?:[+-][a-z0-9]+)*)$")


def is_baseline(name: str) -> bool:
    """A scheduler that is not Atlas: neither the atlas base nor taking turns on the WAN (Atlas's own
    mechanism); multi-TCP (NCCL's socket settings), the warm-up and greedy placement are allowed."""
    return not name.startswith("atlas") and not parse_scheduler(name).temporal


def parse_scheduler(name: str) -> Mechanisms:
    mods_help = ", ".join(f"+{m}" for m in MODIFIERS)
    match = _NAME.match(name)
    if not match:
        raise ValueError(
            f"unknown scheduler {name!r}; use one of {', '.join(BASES)}, optionally followed by "
            f"{mods_help} (or -mechanism to switch one off), e.g. pp-wan+mtcp or atlas-temporal"
        )
    mech = BASES[match["base"]]
    for sign, m in re.findall(r"([+-])([a-z0-9]+)", match["mods"]):
        if m not in MODIFIERS:
            raise ValueError(f"unknown mechanism {m!r} in {name!r}; use {mods_help}")
        on, off = MODIFIERS[m]
        if mech.placement == "dp-wan" and m in ("greedy", "stagger"):
            raise ValueError(f"{name!r}: {match['base']} keeps whole pipelines inside a DC; {sign}{m} applies to "
                             "pipeline bases (pp-wan, pp-1tcp, atlas)")
        if mech.outer and m in ("temporal", "warmup", "bubbletea"):
            raise ValueError(f"{name!r}: {sign}{m} is not built for {match['base']} (its WAN carries outer "
                             "gradients only); use +mtcp or no mechanism")
        mech = replace(mech, **(on if sign == "+" else off), auto=mech.auto - PINS[m])  # type: ignore[arg-type]
    if mech.stagger and not mech.temporal:
        raise ValueError(f"{name!r}: +stagger interleaves turns; it needs +temporal")
    if mech.outer and mech.overlap:
        raise ValueError(f"{name!r}: the overlap mechanism's bucketed collectives inside a sync period are not "
                         "supported yet; drop +overlap")
    if mech.bubbletea and mech.overlap:
        raise ValueError(f"{name!r}: BubbleTea with the overlap mechanism's bucketed collectives is not supported "
                         "yet; add -overlap (e.g. dp-wan-overlap+bubbletea)")
    return mech

"""Schedulers as compositions of mechanisms, so an ablation is one name: `pp-wan+mtcp`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Placement = Literal["dp-wan", "pp-even", "atlas"]


@dataclass(frozen=True)
class Mechanisms:
    placement: Placement  # where stages and replicas go
    multi_tcp: bool  # stripe each WAN transfer over n connections (n from the BDP and window cap)
    temporal: bool  # replicas take turns on a WAN link at full rate instead of sharing it
    stagger: bool  # offset replica start times so their WAN phases interleave
    bubbletea: bool = False  # serve prefill requests inside pipeline bubbles
    warmup: bool = False  # 1F1B with extra warm-up microbatches ahead of WAN hops (memory permitting)


BASES: dict[str, Mechanisms] = {
    "dp-wan": Mechanisms("dp-wan", multi_tcp=False, temporal=False, stagger=False),
    "pp-wan": Mechanisms("pp-even", multi_tcp=False, temporal=False, stagger=False),
    "atlas": Mechanisms("atlas", multi_tcp=True, temporal=True, stagger=True, warmup=True),
}
MODIFIERS: dict[str, dict[str, object]] = {
    "mtcp": {"multi_tcp": True},
    "temporal": {"temporal": True, "stagger": True},
    "greedy": {"placement": "atlas"},
    "bubbletea": {"bubbletea": True},
    "warmup": {"warmup": True},
}


def parse_scheduler(name: str) -> Mechanisms:
    base, *mods = name.split("+")
    if base not in BASES:
        raise ValueError(
            f"unknown scheduler {name!r}; use one of {', '.join(BASES)}, optionally with "
            f"+{', +'.join(MODIFIERS)} (e.g. pp-wan+mtcp)"
        )
    mech = BASES[base]
    for m in mods:
        if m not in MODIFIERS:
            raise ValueError(f"unknown mechanism {m!r} in {name!r}; use +{', +'.join(MODIFIERS)}")
        mech = replace(mech, **MODIFIERS[m])  # type: ignore[arg-type]
    if mech.placement == "dp-wan" and (mech.temporal or mech.multi_tcp):
        raise ValueError(f"{name!r}: dp-wan sends no pipeline traffic over the WAN; use pp-wan+... for ablations")
    return mech

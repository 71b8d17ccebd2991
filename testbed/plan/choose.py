"""Which of Atlas's mechanisms a plan may use: every candidate set of mechanisms, each a fixed composition the plan
builds (testbed/sim/choose.py simulates each once, the simulator being deterministic and fast, and keeps the
fastest).

The `atlas` base leaves every mechanism to the plan (Mechanisms.auto); a `+mechanism` or `-mechanism` in a
scheduler's name pins that one (`atlas-temporal` never takes turns). A candidate is a fixed composition on the
pipeline base (`pp-wan` with greedy placement, multi-TCP, turns, stagger, warm-up each on or off), so its plan
is exactly that composition's plan. An ablation's candidates are Atlas's with one mechanism pinned: a subset,
so Atlas's choice is never slower in the simulator than any of its ablations, nor than any fixed composition
among its candidates (`pp-wan+greedy+mtcp+warmup` included), by construction. Ties go to the candidate with
fewer mechanisms (fewer connections, no turns), listed first.

The turn order is a candidate too (the earliest microbatch or the fixed replica order, `turn_order`'s first),
unless `network.turn_order` names one, and so is the sidecar's handover in the simulator (predictive first,
or reactive: the emulated sidecar's, a notice and its reaction before each handover), unless
`network.sidecar` names one (an emulated run's plan is reactive). What is not searched, and why:
- stagger with the earliest microbatch first: offsets interleave a fixed replica order's turns and only delay
  replicas in the other order, so stagger is a candidate only with turns, dp > 1 and the replica order;
- BubbleTea plans take turns and stripe (turns keep the KV caches behind training, striping lets them fill
  what training leaves of a link; the training-only simulation the choice runs sees neither).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from testbed.spec.mechanisms import BASES, Mechanisms

if TYPE_CHECKING:
    from testbed.plan.plan import Plan

# fields of a Plan that do not change what the simulator does (names, the chosen set's label)
_NOT_SIMULATED = frozenset({"run_id", "scheduler", "mech", "meta"})


def turn_order(dp: int, microbatches: int, schedule: str) -> str:
    """The order turns take on the links (plan/turns.py): the earliest microbatch first, which keeps every
    1F1B pipeline in step. With more replicas than microbatches per replica that order advances each pipeline
    one microbatch per round of all dp replicas, and GPipe sends each replica's microbatches as one burst:
    there the fixed replica order goes first, letting the first replicas finish while the others compute."""
    return "replica" if dp > microbatches or schedule == "gpipe" else "microbatch"


@dataclass(frozen=True)
class Pick:
    """One candidate set of mechanisms."""

    greedy: bool
    mtcp: bool
    turns: bool
    stagger: bool
    warmup: bool
    order: str = ""  # the order turns take (plan/turns.py); "" without turns
    sidecar: str = ""  # how turns hand over (Plan.sidecar); "" without turns or where the spec names it

    def size(self) -> int:
        return sum((self.greedy, self.mtcp, self.turns, self.stagger, self.warmup))


def turn_orders(option: str, dp: int, microbatches: int, schedule: str) -> tuple[str, ...]:
    """The turn orders to try: `network.turn_order` where it names one; else `turn_order`'s pick first (a tie
    keeps it) and the other, with more than one replica (one replica has no one to order)."""
    if option != "auto":
        return (option,)
    first = turn_order(dp, microbatches, schedule)
    return (first,) if dp == 1 else (first, "replica" if first == "microbatch" else "microbatch")


def candidates(mech: Mechanisms, dp: int, orders: tuple[str, ...], sidecars: tuple[str, ...] = ("",)) -> list[Pick]:
    """Every candidate for `mech`: each mechanism in `mech.auto` on and off (turns in each of `orders`, handed
    over by each of `sidecars`), the others as pinned; fewest mechanisms first (ties go to the simpler set,
    then to the first order and sidecar)."""
    def opts(name: str, pinned: bool) -> tuple[bool, ...]:
        return (False, True) if name in mech.auto else (pinned,)

    kv = mech.bubbletea  # KV caches use what training leaves of the links: turns and striping, as far as free
    turn_opts = (True,) if kv and "temporal" in mech.auto else opts("temporal", mech.temporal)
    mtcp_opts = (True,) if kv and "mtcp" in mech.auto else opts("mtcp", mech.multi_tcp)
    out = []
    for greedy in opts("greedy", mech.placement == "atlas"):
        for mtcp in mtcp_opts:
            ways = [(t, o, c) for t in turn_opts for o in (orders if t else ("",)) for c in (sidecars if t else ("",))]
            for turns, order, sidecar in ways:
                staggers = opts("stagger", mech.stagger) if turns and dp > 1 and order == "replica" else (False,)
                for stagger in staggers:
                    for warmup in opts("warmup", mech.warmup):
                        out.append(Pick(greedy, mtcp, turns, stagger, warmup, order, sidecar))
    return sorted(out, key=Pick.size)


def resolved(mech: Mechanisms, pick: Pick) -> Mechanisms:
    """The fixed composition a candidate stands for: `mech` (its transport, BubbleTea) with the pick's
    mechanisms and nothing left to choose."""
    base = BASES["pp-wan"]
    return replace(mech, placement="atlas" if pick.greedy else base.placement, multi_tcp=pick.mtcp,
                   temporal=pick.turns, stagger=pick.stagger, warmup=pick.warmup, auto=frozenset())


def fingerprint(plan: Plan) -> str:
    """The plan as the simulator sees it: every field but the names and the label."""
    return repr([getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name not in _NOT_SIMULATED])


def label(plan: Plan, pick: Pick, base_connections: int) -> str:
    """The mechanisms a plan uses, as the summary's `mechanisms` column: `;`-separated, links as `a-b` joined
    by `|`, e.g. `greedy;mtcp=useast-uscentral|uscentral-uswest;turns=useast-uscentral;replica-order;stagger;warmup`
    (`replica-order`: turns in the fixed replica order, else the earliest microbatch first; `reactive`: the
    chosen handovers wait for the workers' notices, where the spec left the sidecar to the plan).
    Striping names the links where it adds connections, turns the WAN links the pipelines use. A candidate
    whose plan is the same as a simpler one's is never chosen (choose), so greedy, stagger and the warm-up
    appear only where they change the plan (another placement, offsets, extra microbatches)."""
    used = sorted({"-".join(sorted((a, b))) for row in plan.stage_dc for a, b in zip(row, row[1:], strict=False)
                   if a != b})
    striped = sorted({"-".join(sorted(h)) for h, lp in plan.links.items() if lp.connections > base_connections}
                     & set(used))
    parts = ["greedy"] if pick.greedy else []
    if striped:
        parts.append("mtcp=" + "|".join(striped))
    if pick.turns and used:
        parts.append("turns=" + "|".join(used))
        if pick.order == "replica":
            parts.append("replica-order")
        if pick.sidecar == "reactive":
            parts.append("reactive")
    if pick.stagger:
        parts.append("stagger")
    if pick.warmup:
        parts.append("warmup")
    return ";".join(parts) or "none"

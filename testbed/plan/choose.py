"""Which of Atlas's mechanisms a plan uses, per link and regime, decided from the plan's known compute and
transfer schedule (closed-form rules, no simulation of the variants).

The `atlas` base leaves every mechanism to these rules (Mechanisms.auto); a `+mechanism` or `-mechanism` in a
scheduler's name pins that one (`atlas-temporal` never takes turns, whatever the rules say). The rules:

- greedy placement: always (on equal DCs it is the even split; on unlike ones it fills the DCs with most free
  GPUs along the fattest chain, which never adds a WAN hop the even split avoids).
- striping (multi-TCP): on each link where one stage boundary's connections, n W / RTT, carry less than the
  link's capacity; elsewhere it adds no connection.
- turns (temporal sharing): on a link only where replicas' transfers collide (dp > 1) and the link is the
  bottleneck by a wide margin: the time it needs to carry one iteration's bytes at capacity is at least
  TURNS_MIN_LOAD times the busiest stage's compute. Turns give the link to one replica at a time in a fixed
  order (plan/build.py turn_policy), so each pipeline fills and drains at the link's full rate instead of a
  1/dp share of it; the price is that the last replicas in the order wait while the first run, and their
  pipelines' compute no longer overlaps the others' transfers. The first pays only when the link's busy time
  dwarfs the compute that the waiting replicas would otherwise overlap.
- stagger: only with turns and dp > 1 (it interleaves replicas' turns; one replica has nothing to stagger).
- warm-up: on a 1F1B schedule whose WAN round trips exceed a stage's compute (latency_warmup's Little's-law
  count, memory permitting); zero extra microbatches elsewhere, so it is left out where it cannot pay.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from testbed.plan.mechanisms import Mechanisms

# a link takes turns only when its busy time per iteration is at least this share of the busiest stage's compute:
# turns can save at most the time the link is busy, and below 1 % they have nothing measurable to give
TURNS_MIN_LOAD = 0.01
# no warm-up behind a link that takes turns whose load is at least WARMUP_MIN_LOAD, whose transfers per
# microbatch (all replicas) take at least WARMUP_MIN_BUSY_RTT of its round trip, and the two together at least
# WARMUP_MIN_PRODUCT (measured on bench/atlas_vs_ablations.py's points: docs/atlas-mechanisms.md)
WARMUP_MIN_LOAD, WARMUP_MIN_BUSY_RTT, WARMUP_MIN_PRODUCT = 1.7, 0.8, 2.5


def turn_order(dp: int, microbatches: int, schedule: str) -> str:
    """The order turns take on the links the plan chose (plan/turns.py): the earliest microbatch first, which
    keeps every 1F1B pipeline in step. With more replicas than microbatches per replica that order advances
    each pipeline one microbatch per round of all dp replicas, and GPipe sends each replica's microbatches
    as one burst: there the fixed replica order goes first, letting the first replicas finish while the
    others compute."""
    return "replica" if dp > microbatches or schedule == "gpipe" else "microbatch"


@dataclass(frozen=True)
class LinkLoad:
    """One undirected WAN link as the plan loads it."""

    pipes: int  # stage boundaries (over all replicas) whose transfers cross it
    load: float  # its busier direction's time to carry one iteration's bytes at capacity / busiest stage compute
    busy_s: float = 0.0  # that time, per iteration


def link_loads(stage_dc: list[list[str]], act_bytes: list[float], microbatches: int, links: dict,
               compute_s: float) -> dict[frozenset[str], LinkLoad]:
    """Per WAN link used by the pipelines: how many boundaries cross it and how loaded its busier direction is.
    `compute_s`: the busiest stage's compute per iteration (microbatches x forward plus backward)."""
    busy: dict[tuple[str, str], float] = {}
    pipes: dict[frozenset[str], int] = {}
    for row in stage_dc:
        for s in range(len(row) - 1):
            a, b = row[s], row[s + 1]
            if a == b:
                continue
            pipes[frozenset((a, b))] = pipes.get(frozenset((a, b)), 0) + 1
            for h in ((a, b), (b, a)):
                busy[h] = busy.get(h, 0.0) + act_bytes[s] * microbatches / links[h].capacity_bytes_s
    out = {}
    for key, n in pipes.items():
        a, b = sorted(key)
        worst = max(busy.get((a, b), 0.0), busy.get((b, a), 0.0))
        out[key] = LinkLoad(n, worst / compute_s if compute_s > 0 else float("inf"), worst)
    return out


def takes_turns(ll: LinkLoad, kv_caches: bool = False) -> bool:
    """Turns pay on a link that replicas share (more than one boundary crosses it: identical replicas issue
    their transfers at the same instants, so they collide) or that BubbleTea's KV caches may cross (`kv_caches`:
    under turns they go after every training transfer, sharing fairly they slow training: 14 % on
    emu-bubbletea-far), and that is busy for a measurable share of the iteration (TURNS_MIN_LOAD)."""
    return (ll.pipes > 1 or kv_caches) and ll.load >= TURNS_MIN_LOAD


def label(greedy: bool, mtcp_links: list[str], turn_links: list[str], stagger: bool, warmup: bool) -> str:
    """The mechanisms a plan uses, as the summary's `mechanisms` column: `;`-separated, links as `a-b`
    joined by `|`, e.g. `greedy;mtcp=useast-uscentral|uscentral-uswest;turns=useast-uscentral;stagger;warmup`."""
    parts = ["greedy"] if greedy else []
    if mtcp_links:
        parts.append("mtcp=" + "|".join(mtcp_links))
    if turn_links:
        parts.append("turns=" + "|".join(turn_links))
    if stagger:
        parts.append("stagger")
    if warmup:
        parts.append("warmup")
    return ";".join(parts) or "none"


@dataclass(frozen=True)
class Choice:
    """What the rules chose for one plan."""

    mech: Mechanisms  # as resolved (warm-up still as asked: build_plan resolves it with warmup_pays)
    links: dict  # (src, dst) -> LinkPlan with its connections and turns
    mtcp: list[str]  # links (`a-b`) that stripe
    turns: list[str]  # links that take turns
    turn_load: float  # the largest load (LinkLoad.load) of a link that takes turns; 0 without turns
    busy_over_rtt: float  # that link's transfer time per microbatch (all replicas) over its round trip


def choose_links(mech: Mechanisms, stage_dc: list[list[str]], act_bytes: list[float], microbatches: int,
                 compute_s: float, links: dict, base_connections: int, order: str | None) -> Choice:
    """Striping, turns and stagger per link from the plan, for the mechanisms in `mech.auto`. `links` were
    planned with multi-TCP; `order`: the order turns take (None: not known yet)."""
    loads = link_loads(stage_dc, act_bytes, microbatches, links, compute_s)
    names = {key: "-".join(sorted(key)) for key in loads}
    if "temporal" in mech.auto:
        turns = {key for key, ll in loads.items() if takes_turns(ll, mech.bubbletea)}
    else:
        turns = set(loads) if mech.temporal else set()
    if "mtcp" in mech.auto:
        stripe = {key for key, ll in loads.items()  # turns carry one transfer at a time, at full rate
                  if stripe_pays(links[tuple(sorted(key))], replace(ll, pipes=1) if key in turns else ll,
                                 base_connections)}
        links = {h: lp if frozenset(h) in stripe else replace(lp, connections=base_connections)
                 for h, lp in links.items()}
    if "temporal" in mech.auto:
        links = {h: replace(lp, temporal=frozenset(h) in turns) for h, lp in links.items()}
    temporal = bool(turns)
    stagger = stagger_pays(temporal, len(stage_dc), order) if "stagger" in mech.auto else mech.stagger and temporal
    mtcp = sorted(names[key] for key in loads if links[tuple(sorted(key))].connections > base_connections)
    mech = replace(mech, temporal=temporal, stagger=stagger, multi_tcp=bool(mtcp) or mech.multi_tcp,
                   auto=mech.auto - {"temporal", "stagger", "mtcp", "greedy"})
    top = max(turns, key=lambda key: loads[key].load, default=None)
    busy_rtt = 0.0
    if top is not None:
        lp = links[tuple(sorted(top))]  # type: ignore[index]
        busy_rtt = loads[top].busy_s / microbatches / max(lp.rtt_s, 1e-12)
    return Choice(mech, links, mtcp, sorted(names[key] for key in turns),
                  loads[top].load if top is not None else 0.0, busy_rtt)


def stripe_pays(lp, ll: LinkLoad, base_connections: int) -> bool:
    """Stripe a link whose sharers cannot fill it: the boundaries crossing it at once (`ll.pipes`; one on a
    link that takes turns), each at its base connections' n W / RTT, carry less than its capacity (where
    they fill it side by side, more connections only split the same rate)."""
    return ll.pipes * base_connections * lp.window_bytes / max(lp.rtt_s, 1e-12) < lp.capacity_bytes_s


def stagger_pays(temporal: bool, dp: int, order: str | None) -> bool:
    """Stagger interleaves a fixed replica order's turns: only with turns, more than one replica, and the
    replica order (with the earliest microbatch first, offsets only delay replicas)."""
    return temporal and dp > 1 and order in (None, "replica")


def warmup_pays(turn_load: float, busy_over_rtt: float) -> bool:
    """The warm-up (where latency_warmup asks for microbatches) covers round trips with microbatches in
    flight. Behind a link that takes turns, carries more than the compute (`turn_load`) and whose transfers
    per microbatch (all replicas) fill most of its round trip (`busy_over_rtt`), little latency is left to
    cover: more microbatches in flight only queue (they cost 2-10 % in bench/atlas_vs_ablations.py)."""
    return not (turn_load >= WARMUP_MIN_LOAD and busy_over_rtt >= WARMUP_MIN_BUSY_RTT
                and turn_load * busy_over_rtt >= WARMUP_MIN_PRODUCT)

"""Spec -> the lowered network (testbed/net/links.py NetPlan, a changing link's schedule included), and the one place
connection counts are decided: a stage boundary's connections (NCCL's sockets, Atlas's multi-TCP), the most a changing
WAN's plans open, and the fewest that cover a link's bandwidth-delay product for a foreign job."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import replace

from testbed.costs.tcp import connections_for
from testbed.net.links import NetLink, NetPlan, Pair, WanState
from testbed.net.scale import emulate_link
from testbed.net.units import gbps_to_bytes_s, mib_to_bytes, ms_to_s, s_to_ms
from testbed.net.wire import FRAME_BYTES
from testbed.plan.plan import LinkPlan
from testbed.spec.experiment import Experiment
from testbed.spec.mechanisms import Mechanisms
from testbed.spec.topology import Topology, WanLink


def lower_network(topo: Topology, scale: float | None = None, built: NetPlan | None = None) -> NetPlan:
    """Every WAN link in real-world units. With the emulation's k, each link's window and round-robin turn are what
    the emulated link really carries (at least 64 KiB and whole segments after scaling, k x the HTB quantum), so the
    simulator's prediction of an emulated run models the network the emulator builds. `built`: the network as the
    emulator built it, whose windows and turns a link keeps when its rate or latency changes (its hosts' routes and
    HTB classes stay as built); rates, latencies and schedules come from `topo`."""
    out = []
    for link in topo.links:
        cap, lat = gbps_to_bytes_s(link.gbps), ms_to_s(link.latency_ms)
        win, turn = mib_to_bytes(topo.window_mb(link)), link.round_robin_bytes or FRAME_BYTES
        emulated = None
        if built is not None:
            was = built.link(*link.between)
            win, turn, emulated = was.window_bytes, was.turn_bytes, was.emulated
        elif scale is not None:
            emulated = emulate_link(cap, lat, win, scale)
            win, turn = emulated.real_window_bytes, emulated.real_turn_bytes
        out.append(NetLink(*link.between, cap, lat, win, turn, emulated, link_changes(link)))
    return NetPlan(tuple(out), built.scale if built is not None else scale)


def link_changes(link: WanLink) -> tuple[tuple[float, WanState], ...]:
    """A link's schedule from its spec: its trace's steps and its outages merged, each state in force from its time on
    (the first at 0, consecutive states different); empty for a link that never changes. The spec keeps trace points
    and outages in time order, outages apart."""
    if not link.changes:
        return ()
    base = WanState(gbps_to_bytes_s(link.gbps), ms_to_s(link.latency_ms))
    step_t = [p.t_s for p in link.trace or []]
    steps = [WanState(gbps_to_bytes_s(p.gbps), ms_to_s(p.latency_ms)) for p in link.trace or []]
    downs = [(e.at_s, e.at_s + e.down_for_s) for e in link.events]
    starts = [a for a, _ in downs]
    out: list[tuple[float, WanState]] = []
    for t in sorted({0.0, *step_t, *(t for d in downs for t in d)}):
        i, j = bisect.bisect_right(step_t, t) - 1, bisect.bisect_right(starts, t) - 1
        state = replace(steps[i] if i >= 0 else base, up=not (j >= 0 and t < downs[j][1]))
        if not out or out[-1][1] != state:
            out.append((t, state))
    return tuple(out)


def topology_at(topo: Topology, states: Mapping[Pair, WanState]) -> Topology:
    """The topology with these links' rates and latencies and no schedule: what a plan made at some time of a changing
    WAN sees (build_plan places and lowers from a spec). A link that is down keeps its rate: a planner does not re-plan
    for an outage."""
    links = []
    for link in topo.links:
        st = states.get(tuple(link.between))  # type: ignore[call-overload]
        if st is not None:
            link = link.model_copy(update={"gbps": st.gbps, "latency_ms": s_to_ms(st.latency_s), "trace": None,
                                           "events": [], "circuits": None})
        links.append(link)
    return topo.model_copy(update={"links": links})


def boundary_connections(mech: Mechanisms, tp: int, net) -> int:
    """TCP connections a stage boundary opens before multi-TCP. Megatron-LM sends 1/tp of a boundary's
    activation from each TP rank, over NCCL's channels to the peer, each striped over NCCL's sockets."""
    return 1 if mech.transport == "one" else tp * net.nccl_channels_per_peer * net.nccl_sockets


def transfer_connections(exp: Experiment, mech: Mechanisms, capacity_bytes_s: float, window_bytes: float,
                         rtt_s: float) -> int:
    """Connections one stage boundary's transfers use on a link of this capacity, window and RTT."""
    base = boundary_connections(mech, exp.workload.tp, exp.network)
    if mech.multi_tcp:
        return max(base, connections_for(capacity_bytes_s, window_bytes, rtt_s, exp.network.max_tcp_connections))
    return base


def link_plans(exp: Experiment, mech: Mechanisms, net: NetPlan | None = None) -> dict[Pair, LinkPlan]:
    """Both directions of every WAN link of `net` (default: the experiment's topology, unscaled), with the
    connections one stage boundary's transfers use."""
    out = {}
    for link in (net or lower_network(exp.topology)).links:
        n = transfer_connections(exp, mech, link.capacity_bytes_s, link.window_bytes, link.rtt_s)
        for src, dst in ((link.a, link.b), (link.b, link.a)):
            out[(src, dst)] = LinkPlan(src, dst, link.capacity_bytes_s, link.latency_s, link.window_bytes, n,
                                       mech.temporal, link.turn_bytes)
    return out


def opened_connections(exp: Experiment, mech: Mechanisms, net: NetPlan,
                       states: dict[Pair, Iterable[tuple[float, float]]]) -> dict[Pair, int]:
    """Per WAN hop (both directions), the most connections any iteration's plan stripes over on a changing WAN whose
    links pass through `states` ((capacity bytes/s, one-way latency s) per link, beside the link's own): the workers
    open them all at the start, and each iteration uses as many as its plan says."""
    out = {}
    for link in net.links:
        rates = [(link.capacity_bytes_s, link.latency_s), *states.get(link.between, ())]
        n = max(transfer_connections(exp, mech, c, link.window_bytes, 2 * lat) for c, lat in rates)
        out[(link.a, link.b)] = out[(link.b, link.a)] = n
    return out


def covering_connections(net: NetPlan, max_connections: int) -> int:
    """The fewest connections whose windows cover every link's bandwidth-delay product (Atlas's multi-TCP), capped
    at `max_connections`: one count for every link, since a foreign job's socket settings are one per process."""
    return max([1, *(connections_for(link.capacity_bytes_s, link.window_bytes, link.rtt_s, max_connections)
                     for link in net.links)])

"""Spec -> the lowered network (testbed/net/links.py NetPlan), and the one place connection counts are decided: a
stage boundary's connections (NCCL's sockets, Atlas's multi-TCP), the most a changing WAN's plans open, and the
fewest that cover a link's bandwidth-delay product for a foreign job."""

from __future__ import annotations

from collections.abc import Iterable

from testbed.costs.tcp import connections_for
from testbed.net.links import NetLink, NetPlan, Pair
from testbed.net.scale import emulate_link
from testbed.net.units import gbps_to_bytes_s, mib_to_bytes, ms_to_s
from testbed.net.wire import FRAME_BYTES
from testbed.plan.mechanisms import Mechanisms
from testbed.plan.plan import LinkPlan
from testbed.spec.experiment import Experiment
from testbed.spec.topology import Topology


def lower_network(topo: Topology, scale: float | None = None, built: NetPlan | None = None) -> NetPlan:
    """Every WAN link in real-world units. With the emulation's k, each link's window and round-robin turn are what
    the emulated link really carries (at least 64 KiB and whole segments after scaling, k x the HTB quantum), so the
    simulator's prediction of an emulated run models the network the emulator builds. `built`: the network as the
    emulator built it, whose windows and turns a link keeps when its rate or latency changes (its hosts' routes and
    HTB classes stay as built); rates and latencies come from `topo`."""
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
        out.append(NetLink(*link.between, cap, lat, win, turn, emulated))
    return NetPlan(tuple(out), built.scale if built is not None else scale)


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

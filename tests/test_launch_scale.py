"""Pure parts of what `testbed launch` says about the scale k and checks against the model: dilation and
window-floor factors, the choice of k from a measured headroom, and transfer matching and replay on a
synthetic capture table."""

from __future__ import annotations

import math

import pytest

from testbed.costs.tcp import windowed_send_s
from testbed.emu.build import MIN_WINDOW, MSS, emulated_window
from testbed.emu.names import address_plan
from testbed.emu.scale import HEADROOM_SHARE, choose_scale, k_grid, wan_demand_bps
from testbed.errors import SpecError
from testbed.launch.check import HEADER_ONLY_BYTES, check, match_transfers, replay
from testbed.launch.dilation import floor_warnings, link_scale, links_table, transfer_dilation
from testbed.launch.ranks import layout, rank_env
from testbed.launch.wan import parse_scale
from testbed.net.scale import link_mss
from testbed.plan.network import covering_connections, lower_network
from testbed.spec.topology import Topology

W = 6 * 2**20


def ls_at(k: float, gbps: float = 10, latency_ms: float = 33, window: float = W, conns: int = 1):
    return link_scale("a", "b", gbps, latency_ms, window, k, emulated_window(window, k), conns, MIN_WINDOW)


def test_a_faithful_scale_stretches_real_bytes_by_the_rate_ratio_and_keeps_windows():
    ls = ls_at(50)
    assert ls.window_distortion == pytest.approx(1, abs=0.02)  # W/k rounded to whole segments
    spec = min(10e9 / 8, W / ls.rtt_s)
    emu = min(10e9 / 8 / 50, ls.emulated_window_bytes / ls.rtt_s)
    assert ls.dilation_1 == pytest.approx(spec / emu)
    rate_bound = ls_at(50, window=2**30)  # a window far over the product: only the rate is divided
    assert rate_bound.dilation_1 == pytest.approx(50)


def test_transfer_dilation_grows_with_bytes_towards_the_bulk_factor():
    ls = ls_at(50)
    small, big = transfer_dilation(ls, 1000), transfer_dilation(ls, 2**33)
    assert 1 <= small < 1.1 < big  # one packet: latency dominates, and latency is not scaled
    assert big == pytest.approx(ls.dilation_1, rel=0.02)


def test_the_window_floor_is_named_past_2x_with_the_k_that_avoids_it():
    assert floor_warnings([ls_at(50), ls_at(96)]) == []
    ls = ls_at(2000, gbps=400)
    assert ls.window_distortion > 2 and ls.k_faithful == W / MIN_WINDOW
    (line,) = floor_warnings([ls_at(50), ls])
    assert "a-b" in line and "k <= 96" in line and f"{ls.window_distortion:.1f}x" in line
    (out_of_reach,) = floor_warnings([ls], machine_k=2000)
    assert out_of_reach.startswith(line) and "k >= 2,000 only" in out_of_reach
    assert floor_warnings([ls], machine_k=50) == [line]  # the machine could carry k = 96
    # the k it names really has no floor: its window is W / k, rounded to whole segments
    at = ls_at(ls.k_faithful)
    assert abs(at.window_distortion - 1) <= MSS / (W / ls.k_faithful)


def test_the_links_table_has_both_directions_and_k():
    t = links_table([ls_at(50)], 50, {"a": {"spec_gbps": 50, "emulated_mbps": 1000}})
    assert t["scale"] == 50 and {(r["src_dc"], r["dst_dc"]) for r in t["links"]} == {("a", "b"), ("b", "a")}
    assert t["links"][0]["emulated_mbps"] == 200 and t["lans"]["a"]["spec_gbps"] == 50


TOPO = Topology.model_validate({
    "name": "t", "tcp_window_mb": 6,
    "dcs": [{"name": n, "gpus": 2, "hosts": 2, "intra_gbps": 50} for n in ("east", "mid", "west")],
    "links": [{"between": ["east", "mid"], "gbps": 10, "latency_ms": 14},
              {"between": ["mid", "west"], "gbps": 10, "latency_ms": 19},
              {"between": ["east", "west"], "gbps": 10, "latency_ms": 33}]})


RANKS = {"east": 2, "mid": 2, "west": 2}


def test_k_is_the_smallest_grid_value_whose_demand_fits_the_headroom():
    ceiling = 1.2e9
    k = choose_scale(TOPO, ceiling, RANKS, None)
    grid = k_grid()
    assert k in grid and wan_demand_bps(TOPO, k, RANKS, None) <= ceiling * HEADROOM_SHARE
    assert wan_demand_bps(TOPO, grid[grid.index(k) - 1], RANKS, None) > ceiling * HEADROOM_SHARE


def test_gloos_demand_is_the_rank_pairs_windows_up_to_the_link_rate():
    k = 100
    # one link direction east -> mid: 2 x 2 rank pairs, one connection each, a window per 28 ms round trip; the
    # window is the one the emulator builds (whole segments of the path's MTU at 100 Mbit/s)
    one = Topology.model_validate({**TOPO.model_dump(), "links": [TOPO.links[0].model_dump()]})
    win = lower_network(one, k).emulated("east", "mid").window_bytes
    assert win == emulated_window(W, k, link_mss(10e9 / k))
    assert wan_demand_bps(one, k, RANKS, None) == pytest.approx(2 * 4 * win / 0.028 * 8)
    assert wan_demand_bps(one, k, {"east": 1, "mid": 1}, None) == pytest.approx(2 * win / 0.028 * 8)
    # NCCL's sockets cover the bandwidth-delay product: the link's rate
    assert wan_demand_bps(one, k, RANKS, 32) == pytest.approx(2 * 10e9 / k)


def test_nccls_demand_counts_the_connections_the_launch_opens():
    """Every rank pair stripes over the one count `testbed launch` gives every rank (plan/network.py
    covering_connections: the most any link needs), not a count of each link's own."""
    k, conns = 100, 3
    net = lower_network(TOPO, k)
    n = covering_connections(net, conns)
    assert n == conns  # the 33 ms link needs more than 3 windows in flight: the cap holds
    expected = sum(2 * min(lk.emulated.capacity_bytes_s, 4 * n * lk.emulated.window_bytes / lk.rtt_s) * 8
                   for lk in net.links)
    assert wan_demand_bps(TOPO, k, RANKS, conns) == pytest.approx(expected)
    assert wan_demand_bps(TOPO, k, RANKS, conns) > wan_demand_bps(TOPO, k, RANKS, None)


def test_more_headroom_fewer_ranks_or_fewer_connections_never_need_a_larger_k():
    ks = [choose_scale(TOPO, c, RANKS, None) for c in (0.2e9, 1e9, 4e9, 16e9)]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1]
    assert choose_scale(TOPO, 1e9, {"east": 1, "mid": 1, "west": 1}, None) <= choose_scale(TOPO, 1e9, RANKS, None)
    assert choose_scale(TOPO, 1e9, RANKS, None) <= choose_scale(TOPO, 1e9, RANKS, 32)
    # with room for anything, k stops where check_scale's range starts (the 100 Gbit/s a veth can carry)
    fast = TOPO.model_copy(update={"links": [lk.model_copy(update={"gbps": 400}) for lk in TOPO.links]})
    assert choose_scale(fast, 1e15, RANKS, 32) == 5


def test_no_headroom_is_a_clear_error():
    with pytest.raises(SpecError, match="--scale"):
        choose_scale(TOPO, 0, RANKS, None)
    assert parse_scale("auto") == 0 and parse_scale("50") == 50 and parse_scale(None) is None
    for bad in ("fast", "0", "-3"):
        with pytest.raises(SpecError, match="--scale"):
            parse_scale(bad)


def test_ranks_learn_k_and_the_link_table():
    slots = layout(address_plan(TOPO, "gdtbl1"), 1)
    env = rank_env(slots[0], slots, master_port=1, connections=1, dcs=["east"], gpus=[], in_container=False,
                   out_dir="/o", threads=1, scale=50, links_file="/o/links.json")
    assert env["TESTBED_SCALE"] == "50" and env["TESTBED_LINKS"] == "/o/links.json"


# --- transfer matching and replay on a synthetic capture table ---------------------------------------

CAP, WIN, RTT_S = 25e6, 125_000, 0.066


def windowed_rows(t0_ms: int, nbytes: float, src="10.0.0.1", dst="10.0.1.1", sport="40000", win=WIN, cap=CAP):
    """Capture rows of one window-bound transfer: a window at the link's rate every round trip."""
    rows, t, left = [], t0_ms, nbytes
    while left > 0:
        w = min(win, left)
        ms = max(1, round(w / cap * 1e3))
        rows += [{"link": "a-b", "towards": "b", "t_ms": t + j, "src": src, "dst": dst, "sport": sport,
                  "dport": "5000", "bytes": w / ms, "packets": 2} for j in range(ms)]
        left -= w
        t += round(RTT_S * 1e3)
    return rows


def test_matching_joins_windows_a_round_trip_apart_and_splits_at_longer_silences():
    rows = windowed_rows(100, 1e6) + windowed_rows(2000, 2e6)
    xs = match_transfers(rows, {"a-b": RTT_S * 1e3})
    assert [(x.start_ms, round(x.nbytes)) for x in xs] == [(100, 1_000_000), (2000, 2_000_000)]
    assert all(x.connections == 1 for x in xs)


def test_acknowledgements_small_transfers_and_extra_connections():
    rows = windowed_rows(100, 1e6)
    acks = [{**rows[0], "t_ms": 100 + 30 * i, "bytes": 66 * 3, "packets": 3} for i in range(1, 40)]
    assert HEADER_ONLY_BYTES >= 66
    (x,) = match_transfers(rows + acks, {"a-b": RTT_S * 1e3})  # acks would have bridged and stretched it
    assert x.end_ms == rows[-1]["t_ms"] + 1
    two = windowed_rows(100, 5e5, sport="40000") + windowed_rows(100, 5e5, sport="40001")
    (y,) = match_transfers(two, {"a-b": RTT_S * 1e3})
    assert y.connections == 2 and y.nbytes == pytest.approx(1e6)
    assert match_transfers(windowed_rows(100, 1e5), {"a-b": RTT_S * 1e3}) == []  # under MIN_BYTES


def test_the_replay_agrees_with_the_window_formula_and_the_synthetic_capture():
    rows = windowed_rows(100, 1e6) + windowed_rows(2000, 2e6)
    per_link, xs = check(rows, {"a-b": (CAP, WIN, RTT_S)})
    for x in xs:
        assert x.model_s == pytest.approx(windowed_send_s(x.nbytes, CAP, WIN, RTT_S))
        assert abs(x.error) < 0.01  # the synthetic capture is the model's own pattern, to the millisecond
    (c,) = per_link
    assert (c.link, c.towards, c.transfers) == ("a-b", "b", 2)


def test_competing_transfers_share_the_link_in_the_replay():
    from testbed.launch.check import Transfer

    alone = [Transfer("a-b", "b", "s", "d", 0.0, 0.0, 5e6, 1)]
    both = [Transfer("a-b", "b", "s", "d", 0.0, 0.0, 5e6, 1), Transfer("a-b", "b", "s2", "d", 0.0, 0.0, 5e6, 1)]
    replay(alone, CAP, math.inf, RTT_S)  # rate-bound: no window limit
    replay(both, CAP, math.inf, RTT_S)
    assert alone[0].model_s == pytest.approx(5e6 / CAP)
    assert both[0].model_s == pytest.approx(2 * alone[0].model_s) == pytest.approx(both[1].model_s)


def test_launch_buffers_advertise_the_windows_whole_segments_and_not_one_more():
    from types import SimpleNamespace

    from testbed.emu.build import FOREIGN_SHARE
    from testbed.launch.windows import launch_rmem
    from testbed.plan.network import lower_network

    for k in (20, 50, 100):
        win = emulated_window(W, k)
        emu = SimpleNamespace(topo=TOPO, net=lower_network(TOPO, k), host_window=lambda dc, w=win: w,
                              window_bytes=lambda a, b, w=win: w,
                              mss=lambda a, b: MSS)
        advertised = launch_rmem(emu, "east") * FOREIGN_SHARE
        assert win < advertised < win + MSS  # the build's buffer advertised a few bytes either side of win


def test_temporal_replay_serves_the_first_receivers_transfer_first():
    from testbed.launch.check import Transfer

    def pair():
        return [Transfer("a-b", "b", "s", "d0", 0.0, 0.0, 5e6, 1), Transfer("a-b", "b", "s", "d1", 0.0, 0.0, 5e6, 1)]

    turns = pair()
    replay(turns, CAP, math.inf, RTT_S, prio={"d0": 0, "d1": 1})
    assert turns[0].model_s == pytest.approx(5e6 / CAP) and turns[1].model_s == pytest.approx(2 * 5e6 / CAP)
    turns = pair()
    replay(turns, CAP, math.inf, RTT_S, prio={"d0": 1, "d1": 0})
    assert turns[1].model_s == pytest.approx(5e6 / CAP) and turns[0].model_s == pytest.approx(2 * 5e6 / CAP)

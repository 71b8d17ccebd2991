"""The simulator against closed forms it must reproduce exactly."""

from __future__ import annotations

import math

import pytest

from testbed.analysis.metrics import share
from testbed.costs.tcp import windowed_send_s
from testbed.runtime.htb import FRAME_BYTES
from testbed.sim.executor import SlidingWindow, simulate
from tests.conftest import make_plan


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("pp", "m"), [(1, 1), (2, 3), (4, 8), (6, 4), (8, 32)])
def test_pipeline_iteration_and_bubble(schedule, pp, m):
    f, b = 1.5, 3.0
    tl, _ = simulate(make_plan(pp=pp, m=m, f=f, b=b, schedule=schedule))
    assert tl.iteration_s[0] == pytest.approx((m + pp - 1) * (f + b), rel=1e-12)
    assert share(tl, ("idle",)) == pytest.approx((pp - 1) / (m + pp - 1), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("conns", [1, 4, 64])
@pytest.mark.parametrize("latency", [0.005, 0.035])
def test_striped_transfer_time(conns, latency):
    """A single transfer over n connections sends a window n W per round trip at the link's rate: it takes
    l + (q - 1) RTT + its last window / C for q windows, or l + bytes / C when n W fills the round trip."""
    C, W, A = 5e9, 2**20, 3e8
    plan = make_plan(pp=2, m=1, f=1.0, b=1.0, dcs=["a", "b"], act_bytes=A, capacity=C, latency=latency,
                     window=W, connections=conns)
    tl, _ = simulate(plan)
    recv = [iv for iv in tl.intervals if iv.kind == "recv" and iv.stage == 1]
    assert len(recv) == 1
    assert recv[0].dur == pytest.approx(latency + windowed_send_s(A, C, conns * W, 2 * latency), rel=1e-12)


@pytest.mark.parametrize(("A", "W", "C", "rtt"), [(4.5, 1.0, 1e3, 0.04), (3.0, 1.0, 100.0, 0.02), (0.4, 1.0, 10.0, 0.1),
                                                  (10.0, 1.0, 10.0, 0.2), (7.0, 2.0, 20.0, 0.05)])
def test_windowed_send_closed_form(A, W, C, rtt):
    """q windows take (q - 1) round trips and the last window's time on the link (window-bound); a window
    that outlasts the round trip leaves the link busy (A / C); and it is never faster than the link."""
    t = windowed_send_s(A, C, W, rtt)
    if C * rtt <= W:
        assert t == pytest.approx(A / C)
    else:
        q = math.ceil(A / W)
        assert t == pytest.approx((q - 1) * rtt + (A - (q - 1) * W) / C)
        assert A / (W / rtt) - rtt < t <= A / (W / rtt) + W / C  # within a round trip of the fluid n W / RTT
    assert t >= A / C


def test_sliding_window_frees_each_piece_a_round_trip_after_it_started():
    w = SlidingWindow(window=10.0, rtt_s=1.0)
    assert w.budget(0.0) == 10.0
    w.sent(0.0, 6.0)
    assert w.budget(0.5) == 4.0  # what the first piece left free
    w.sent(0.5, 4.0)
    assert w.budget(0.9) == 0.0 and w.next_free_s() == 1.0
    assert w.budget(1.0) == 6.0  # the first piece is acknowledged; the second is still in flight
    assert w.next_free_s() == 1.5
    assert w.budget(1.5) == 10.0
    w.sent(3.5, 10.0)
    assert w.budget(3.6) == 0.0 and w.next_free_s() == 4.5


def test_sliding_window_joins_a_piece_sent_straight_after_the_last():
    """Pieces of one stream (the next starts as the last ends) are one piece: a pipe that sends each freed piece
    again as its own would split its window into one piece per transfer."""
    w = SlidingWindow(window=10.0, rtt_s=1.0)
    w.sent(0.0, 6.0)
    w.ended(0.6)
    w.sent(0.6, 4.0)  # straight after: joins the first
    assert len(w.pieces) == 1 and w.budget(0.9) == 0.0
    assert w.budget(1.0) == 10.0
    w.ended(1.5)
    w.sent(1.7, 2.0)  # after a gap: a piece of its own
    assert len(w.pieces) == 1 and w.next_free_s() == 2.7


def test_a_transfer_late_in_a_round_waits_for_its_own_bytes():
    """Two 1.5-window transfers on one pipe, the second issued late in the round of the first's tail: it gets
    what that tail left free at once, the next half window when the tail is acknowledged, and its last half
    window only a round trip after its own first bytes left (a window slides). A round-based window gave it a
    whole window when the tail's round ended, and read such pipelines up to 9 % fast."""
    C, W, rtt, f = 1e9, 1e8, 1.0, 1.8  # a window takes 0.1 s on the link: window-bound
    plan = make_plan(pp=2, m=2, f=f, b=0.5, dcs=["a", "b"], act_bytes=1.5 * W, capacity=C, latency=rtt / 2,
                     window=W, connections=1, schedule="gpipe")
    tl, _ = simulate(plan)
    ends = sorted(iv.end_s for iv in tl.intervals if iv.kind == "recv" and iv.stage == 1)
    # the first, issued at f: W at C, its last 0.5 W a round trip later (2.8-2.85), arriving half a round trip on
    assert ends[0] == pytest.approx(2.85 + 0.5, rel=1e-9)
    # the second, issued at 2f = 3.6: 0.5 W at once, 0.5 W when the tail's acknowledgements are back (3.8), the
    # last 0.5 W when its own first bytes' are (4.6-4.65); the round model sent W at 3.8 and arrived at 4.4
    assert ends[1] == pytest.approx(4.65 + 0.5, rel=1e-9)
    assert len(ends) == 2


def _send_ends(temporal: bool) -> list[float]:
    A, C = 1e9, 1e9
    plan = make_plan(pp=2, dp=2, m=1, f=1.0, b=1.0, dcs=["a", "b"], act_bytes=A, capacity=C, latency=0.0,
                     temporal=temporal)
    tl, _ = simulate(plan)
    return sorted(iv.end_s - 1.0 for iv in tl.intervals if iv.kind == "send" and iv.stage == 0)


def test_two_transfers_spatial_sharing():
    """Fair sharing; the round robin serves replica 0's first frame before replica 1's: replica 0 is alone on
    the link for one frame's time, so it ends that much before 2A/C, and replica 1 at 2A/C."""
    frame_s = FRAME_BYTES / 1e9
    assert _send_ends(False) == pytest.approx([2.0 - frame_s, 2.0], abs=1e-12)


def test_two_transfers_temporal_sharing():
    assert _send_ends(True) == pytest.approx([1.0, 2.0])  # A/C, then 2A/C


def test_intra_dc_allreduce_ring_time():
    G, bw, dp = 8e9, 1e10, 4
    plan = make_plan(pp=1, dp=dp, m=1, f=1.0, b=1.0, grad_bytes=G, intra_bw=bw)
    tl, _ = simulate(plan)
    ar = [iv.dur for iv in tl.intervals if iv.kind == "allreduce"]
    assert ar == pytest.approx([2 * (dp - 1) / dp * G / bw] * dp)
    assert tl.iteration_s[0] == pytest.approx(2.0 + 2 * (dp - 1) / dp * G / bw)


def _recv_ends(plan, stage: int, replica: int = 0) -> list[float]:
    tl, _ = simulate(plan)
    return [iv.end_s for iv in sorted((iv for iv in tl.intervals if iv.kind == "recv" and iv.stage == stage
                                       and iv.replica == replica), key=lambda iv: iv.start_s)]


def test_a_pipe_carries_its_transfers_in_order_with_one_window():
    """A stage boundary's connections are one FIFO with one window: under GPipe all forwards are issued at
    once, and the pipe sends n W per round trip across them, so activation i arrives in the round that carries
    its last byte ((i + 1) A / n W windows after the first), in microbatch order, not all together."""
    A, W, lat, n, m, f = 4e8, 2**22, 0.02, 3, 6, 1e-3
    plan = make_plan(pp=2, m=m, f=f, b=f, schedule="gpipe", dcs=["a", "b"], act_bytes=A, capacity=1e15,
                     latency=lat, window=W, connections=n)
    ends = _recv_ends(plan, 1)
    expected = [f + (math.ceil((i + 1) * A / (n * W)) - 1) * 2 * lat + lat for i in range(m)]
    assert ends == pytest.approx(expected, rel=1e-6)


def test_each_pipe_has_its_own_window():
    """Two replicas' pipes on one link each send their own window per round trip; the link's capacity is the
    only thing they share (at W / RTT the two windows fill it: both finish at 2 A / C, replica 0 one frame's
    time sooner)."""
    A, W, lat = 4e8, 2**22, 0.02
    rate = W / (2 * lat)
    for capacity, expect in ((1e15, windowed_send_s(A, 1e15, W, 2 * lat)), (rate, 2 * A / rate)):
        plan = make_plan(pp=2, dp=2, m=1, f=1.0, b=1.0, dcs=["a", "b"], act_bytes=A, capacity=capacity,
                         latency=lat, window=W)
        ahead = [FRAME_BYTES / capacity, 0.0]  # the round robin serves replica 0's first frame first
        for r in range(2):
            assert _recv_ends(plan, 1, r) == pytest.approx([1.0 + expect + lat - ahead[r]], rel=1e-9)

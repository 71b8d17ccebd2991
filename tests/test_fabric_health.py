"""The emulated DC fabric's own check (testbed/emu/fabric.py): transfers and all-reduces inside a DC measured against
the rate the fabric is shaped to, never against the simulator."""

import pytest

from testbed.emu.fabric import allreduce_excess_s, bucketed_excess_s, lan_transfer_excess_s, ring_s
from testbed.emu.health import Budget, Health, verdict
from testbed.timeline import Interval

BW = {"a": 1e8, "b": 1e8}  # bytes/s
LAT = {"a": 5e-6, "b": 5e-6}


def iv(kind, stage, replica, start, end, nbytes=0.0, dc="a", it=1, mb=0):
    return Interval(it, f"s{stage}r{replica}", dc, stage, replica, kind, mb, start, end, nbytes)


def compute(stage, replica, dc="a"):
    return iv("fwd", stage, replica, 0.0, 0.001, dc=dc)


def test_a_lone_message_inside_a_dc_counts_what_it_took_beyond_its_rate():
    alone = 1e6 / BW["a"] + LAT["a"]
    ivs = [compute(0, 0), compute(1, 0), iv("recv", 1, 0, 0.1, 0.1 + alone + 0.002, 1e6)]
    assert lan_transfer_excess_s(ivs, BW, LAT) == pytest.approx(0.002)


def test_messages_across_the_wan_or_queued_behind_another_are_left_out():
    alone = 1e6 / BW["a"] + LAT["a"]
    wan = [compute(0, 0, "b"), compute(1, 0), iv("recv", 1, 0, 0.1, 0.1 + alone + 0.05, 1e6)]
    assert lan_transfer_excess_s(wan, BW, LAT) == 0.0  # its sender runs in another DC
    queued = [compute(0, 0), compute(1, 0), iv("recv", 1, 0, 0.1, 0.1 + alone, 1e6),
              iv("recv", 1, 0, 0.1 + alone / 2, 0.1 + 2 * alone, 1e6)]  # the second waited for the first
    assert lan_transfer_excess_s(queued, BW, LAT) == 0.0


def test_an_all_reduce_counts_from_its_last_member_joining():
    ring = ring_s(3e6, 3, BW["a"], LAT["a"])
    ivs = [iv("allreduce", 0, 0, 0.0, 0.5 + ring + 0.01), iv("allreduce", 0, 1, 0.2, 0.5 + ring + 0.01),
           iv("allreduce", 0, 2, 0.5, 0.5 + ring + 0.01)]  # replica 2 joined last; the ring then took 10 ms more
    assert allreduce_excess_s(ivs, [3e6], BW, LAT) == pytest.approx(0.01)
    across = [iv("allreduce", 0, 0, 0.0, 1.0), iv("allreduce", 0, 1, 0.0, 1.0, dc="b")]
    assert allreduce_excess_s(across, [3e6], BW, LAT) == 0.0  # the WAN's part: the delay line's health


def test_each_inner_all_reduce_of_a_sync_period_counts_on_its_own():
    """DiLoCo's period holds one all-reduce per inner step: the first one slow (10 ms beyond its ring), the second
    on time; the slow one counts, not only the period's last."""
    ring = ring_s(3e6, 2, BW["a"], LAT["a"])
    ivs = [iv("allreduce", 0, r, 0.0, ring + 0.01) for r in (0, 1)]
    ivs += [iv("allreduce", 0, r, 0.1, 0.1 + ring) for r in (0, 1)]
    assert allreduce_excess_s(ivs, [3e6], BW, LAT) == pytest.approx(0.01)


def test_bucketed_collectives_count_their_excess_summed_over_a_stages_stream():
    """Three members in one DC: a reduce-scatter 10 ms and an all-gather 5 ms beyond half a ring each (from the last
    member's start), stage 0; stage 1's one 12 ms: the worst stage's sum, 15 ms. The exposed-wait `allreduce`
    intervals of a bucketed stage are no all-reduce."""
    half = 2 / 3 * 3e6 / BW["a"] + 2 * LAT["a"]
    ivs = [iv("reduce_scatter", 0, r, 0.1 * r, 0.2 + half + 0.01, 3e6) for r in range(3)]
    ivs += [iv("all_gather", 0, r, 0.5, 0.5 + half + 0.005, 3e6, mb=1) for r in range(3)]
    ivs += [iv("reduce_scatter", 1, r, 0.0, half + 0.012, 3e6) for r in range(3)]
    ivs += [iv("allreduce", 0, r, 0.0, 0.2 + half + 0.01) for r in range(3)]
    assert bucketed_excess_s(ivs, BW, LAT) == pytest.approx(0.015)
    assert allreduce_excess_s(ivs, [3e6, 3e6], BW, LAT) == 0.0
    across = [iv("reduce_scatter", 0, 0, 0.0, 1.0, 3e6), iv("reduce_scatter", 0, 1, 0.0, 1.0, 3e6, dc="b")]
    assert bucketed_excess_s(across, BW, LAT) == 0.0  # hierarchical: the WAN's part is the delay line's


def test_a_slow_fabric_alone_marks_a_run_degraded_and_is_named():
    why = verdict(Health(), Budget(0.0, 0.0, 0.0, 0.0, fabric=0.06), 0.04)
    assert "slow DC fabric" in why
    assert verdict(Health(), Budget(0.0, 0.0, 0.0, 0.0, fabric=0.01), 0.04) == ""

"""The emulated DC fabric's own check (testbed/emu/fabric.py): transfers and all-reduces inside a DC measured against
the rate the fabric is shaped to, never against the simulator."""

import pytest

from testbed.emu.fabric import allreduce_excess_s, lan_transfer_excess_s, ring_s
from testbed.emu.health import Budget, Health, verdict
from testbed.timeline import Interval

BW = {"a": 1e8, "b": 1e8}  # bytes/s
LAT = {"a": 5e-6, "b": 5e-6}


def iv(kind, stage, replica, start, end, nbytes=0.0, dc="a", it=1):
    return Interval(it, f"s{stage}r{replica}", dc, stage, replica, kind, 0, start, end, nbytes)


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


def test_a_slow_fabric_alone_marks_a_run_degraded_and_is_named():
    why = verdict(Health(), Budget(0.0, 0.0, 0.0, 0.0, fabric=0.06), 0.04)
    assert "slow DC fabric" in why
    assert verdict(Health(), Budget(0.0, 0.0, 0.0, 0.0, fabric=0.01), 0.04) == ""

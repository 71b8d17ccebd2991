"""testbed/net/units.py: the conversions against known values, both ways, on floats and arrays."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.net import units as u


def test_rates_against_known_values():
    assert u.gbps_to_bytes_s(400) == 50e9  # a 400 Gbit/s link moves 50 GB per second
    assert u.gbps_to_bps(0.2) == 200e6
    assert u.gbps_to_mbps(0.1) == 100.0
    assert u.mbps_to_bytes_s(8) == 1e6
    assert u.bps_to_bytes_s(8_000) == 1_000
    assert u.bytes_s_to_bps(1_000) == 8_000
    assert u.bps_to_gbps(25e9) == 25.0


def test_times_and_sizes_against_known_values():
    assert u.ms_to_s(33) == 0.033 and u.s_to_ms(0.5) == 500.0
    assert u.mib_to_bytes(6) == 6 * 1_048_576  # binary, as the kernel counts a window
    assert u.bytes_to_kib(65_536) == 64.0


@pytest.mark.parametrize("there, back", [
    (u.gbps_to_bytes_s, u.bytes_s_to_gbps), (u.mbps_to_bytes_s, u.bytes_s_to_mbps),
    (u.bps_to_bytes_s, u.bytes_s_to_bps), (u.ms_to_s, u.s_to_ms), (u.gbps_to_bps, u.bps_to_gbps)])
def test_each_pair_round_trips(there, back):
    for x in (0.0, 1.0, 12.5, 400.0, 1.6e3):
        assert back(there(x)) == pytest.approx(x, rel=1e-15)


def test_arrays_convert_elementwise():
    assert list(u.bytes_s_to_gbps(np.array([1.25e9, 5e10]))) == [10.0, 400.0]

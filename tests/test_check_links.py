"""`topology check`'s warning: a link whose workers' transport reads under 90 % of its window model."""

from __future__ import annotations

import pytest

from testbed.emu.check import LINKS_HEADER, below_model, model_at_rtt_mbps

WINDOW_KIB = 62.5  # 0.512 Mbit: at 28 ms one connection's model is 18.29 Mbit/s, eight connections' 146.3


def row(link: str, w1: float, wn: float, m1: float = 20.0, mn: float = 150.0, rtt1: float = 28.0,
        rttn: float = 28.0) -> dict:
    return {"link": link, "streams": 8, "workers_mbps_1": w1, "workers_mbps_n": wn, "model_mbps_1": m1,
            "model_mbps_n": mn, "configured_mbps": 200.0, "configured_rtt_ms": 28.0, "window_kib": WINDOW_KIB,
            "workers_rtt_ms_1": rtt1, "workers_rtt_ms_n": rttn}


def test_links_csv_has_the_workers_columns_beside_iperf3s():
    for col in ("measured_mbps_1", "measured_mbps_n", "workers_mbps_1", "workers_mbps_n", "model_mbps_1",
                "model_mbps_n", "workers_rtt_ms_1", "workers_rtt_ms_n"):
        assert col in LINKS_HEADER


def test_a_link_at_its_model_gets_no_warning():
    assert below_model([row("a-b", 19.9, 149.0), row("b-c", 18.0, 135.0)]) == []  # 90 % exactly passes


def test_a_link_under_90_percent_gets_one_line_naming_each_measurement_that_misses():
    lines = below_model([row("a-b", 13.3, 149.0), row("b-c", 19.9, 105.8), row("a-c", 17.0, 100.0)])
    assert len(lines) == 3 and all("\n" not in x for x in lines)
    assert lines[0].startswith("a-b: ") and "on 1 connection(s), 66.5%" in lines[0] and "on 8" not in lines[0]
    assert lines[1].startswith("b-c: ") and "on 8 connection(s), 70.5%" in lines[1] and "on 1" not in lines[1]
    assert lines[2].startswith("a-c: ") and "on 1 connection(s), 85.0%" in lines[2]
    assert "on 8 connection(s), 66.7%" in lines[2]


def test_the_model_at_another_rtt_is_the_window_over_it_up_to_the_capacity():
    r = row("a-b", 0, 0)
    assert model_at_rtt_mbps(r, 1, 28.0) == pytest.approx(62.5 * 1024 * 8 / 1e6 / 0.028)
    assert model_at_rtt_mbps(r, 8, 35.0) == pytest.approx(8 * 62.5 * 1024 * 8 / 1e6 / 0.035)
    assert model_at_rtt_mbps(r, 100, 28.0) == 200.0  # link-bound


def test_the_warning_names_the_paths_rtt_when_the_transport_gets_the_model_at_it():
    at_35 = model_at_rtt_mbps(row("a-b", 0, 0), 8, 35.0)  # what eight windows carry on a 35 ms path
    (slow_path,) = below_model([row("a-b", 18.2, at_35, mn=146.3, rttn=35.0)])
    assert "TCP measured an RTT of 35.0 ms" in slow_path and "the path's RTT is longer than the configured 28 ms" in \
        slow_path
    (short,) = below_model([row("a-b", 18.2, 0.7 * at_35, mn=146.3, rttn=35.0)])
    assert "falls short of the model even at the RTT it measured" in short and "path's RTT" not in short

"""`topology check`'s warning: a link whose workers' transport reads under 90 % of its window model."""

from __future__ import annotations

from testbed.emu.check import LINKS_HEADER, below_model


def row(link: str, w1: float, wn: float, m1: float = 20.0, mn: float = 150.0) -> dict:
    return {"link": link, "streams": 8, "workers_mbps_1": w1, "workers_mbps_n": wn, "model_mbps_1": m1,
            "model_mbps_n": mn}


def test_links_csv_has_the_workers_columns_beside_iperf3s():
    for col in ("measured_mbps_1", "measured_mbps_n", "workers_mbps_1", "workers_mbps_n", "model_mbps_1",
                "model_mbps_n"):
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

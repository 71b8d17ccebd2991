"""The cluster demo's comparison (bench/cluster_demo.py compare): pure, on links.csv rows."""

from __future__ import annotations

from bench.cluster_demo import compare


def row(link: str, w1: float, wn: float, rtt: float, m1: float = 30.0, mn: float = 200.0) -> dict:
    return {"link": link, "workers_mbps_1": w1, "workers_mbps_n": wn, "model_mbps_1": m1, "model_mbps_n": mn,
            "rtt_avg_ms": rtt, "configured_rtt_ms": 28.0}


def test_matching_runs_pass() -> None:
    rows = compare([row("a-b", 29.5, 199.0, 28.4)], [row("a-b", 30.0, 198.0, 28.5)])
    assert [r["metric"] for r in rows] == ["workers_mbps_1", "workers_mbps_n", "rtt_avg_ms"]
    assert all(r["ok"] for r in rows)


def test_a_link_under_its_model_fails_even_when_the_single_machine_agrees() -> None:
    rows = compare([row("a-b", 25.0, 199.0, 28.4)], [row("a-b", 25.0, 199.0, 28.4)])
    assert [r["ok"] for r in rows] == [False, True, True]


def test_a_tunnel_slower_than_one_machine_fails() -> None:
    rows = compare([row("a-b", 29.5, 199.0, 31.0)], [row("a-b", 30.0, 199.0, 28.5)])
    assert [r["ok"] for r in rows] == [True, True, False]


def test_iteration_times_compare_per_scheduler_emulated_rows_only() -> None:
    from bench.cluster_demo import compare_iterations

    single = [{"scheduler": "pp-wan", "source": "emu", "iteration_s": "1.00"},
              {"scheduler": "pp-wan", "source": "sim", "iteration_s": "2.00"}]
    ok = compare_iterations([{"scheduler": "pp-wan", "source": "emu", "iteration_s": "1.04"}], single)
    slow = compare_iterations([{"scheduler": "pp-wan", "source": "emu", "iteration_s": "1.06"}], single)
    assert [r["ok"] for r in ok] == [True] and [r["ok"] for r in slow] == [False]

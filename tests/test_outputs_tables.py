"""Tables that follow the question: swept keys as columns, serving metrics for +bubbletea, constants in the
caption, blocks that fit the width without cutting a header, and columns added or missing later."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from rich.console import Console

from testbed.errors import SpecError
from testbed.tables import blocks, fmt_value, rich_tables, table_width, view


def summary(rows: list[dict]) -> pd.DataFrame:
    base = {"run_id": "p00-x", "source": "sim", "model": "gpt3-175b", "dcs": "a|b", "gpus": 1024, "tp": 8, "pp": 4,
            "dp": 32, "microbatches": 8, "wan_latency_ms": 10.0, "wan_gbps": 100.0, "tcp_connections": 1,
            "tokens_per_s": 1e6, "tokens_per_s_per_gpu": 900.0, "gpu_util": 0.5, "bubble_frac": 0.4,
            "lower_bound_s": 1.0, "scale": 1.0, "degraded": ""}
    return pd.DataFrame([{**base, **r} for r in rows])


def sweep_2d() -> pd.DataFrame:
    rows = []
    for i, (lat, cap) in enumerate([(5, 100), (5, 400), (50, 100), (50, 400)]):
        for s, it in (("pp-wan", 3.0), ("atlas", 1.5)):
            rows.append({"run_id": f"p{i:02d}-{s}", "scheduler": s, "iteration_s": it * (1 + lat / 50),
                         "wan_latency_ms": float(lat), "wan_gbps": float(cap),
                         "sweep": f"topology.links.*.latency_ms={lat};topology.links.*.gbps={cap}"})
    return summary(rows)


def render(tables, width: int) -> str:
    buf = io.StringIO()
    c = Console(file=buf, width=width, color_system=None)
    for t in tables:
        c.print(t)
    return buf.getvalue()


def test_swept_keys_lead_and_constants_go_to_the_caption():
    v = view(sweep_2d(), "t")
    assert v.headers[:3] == ["latency_ms", "gbps", "scheduler"] and v.keys == 3
    assert "iteration_s" in v.headers
    # implied by the sweep (constant inside each point): not a column of its own
    assert "wan_latency_ms" not in v.headers and "wan_gbps" not in v.headers
    assert "model gpt3-175b" in v.caption and "gpus 1024" in v.caption and "lower_bound_s 1" in v.caption
    assert v.rows[0][:3] == ["5", "100", "pp-wan"]


def test_serving_metrics_only_with_bubbletea():
    plain = view(summary([{"scheduler": "atlas", "iteration_s": 1.0, "ttft_p99_ms": float("nan")}]), "t")
    assert "ttft_p99_ms" not in plain.headers
    bt = view(summary([{"scheduler": "atlas", "iteration_s": 1.0},
                       {"scheduler": "atlas+bubbletea", "iteration_s": 1.0, "ttft_p99_ms": 1234.5,
                        "served_in_bubbles": 0.42, "prefill_util": 0.1, "train_slowdown": 0.0}]), "t")
    for c in ("ttft_p99_ms", "served_in_bubbles", "prefill_util"):
        assert c in bt.headers, c
    row = bt.rows[1]
    assert row[bt.headers.index("served_in_bubbles")] == "42.0%"
    assert row[bt.headers.index("ttft_p99_ms")] == "1,234"


def test_unknown_columns_are_shown_and_missing_ones_are_not_an_error():
    df = sweep_2d().drop(columns=["bubble_frac", "lower_bound_s", "tokens_per_s_per_gpu"])
    df["speedup_vs_best"] = [1.0, 2.0] * 4
    df["brand_new_metric_s"] = [0.1 * i for i in range(8)]
    df["status"] = "ok"
    v = view(df, "t")
    assert "speedup_vs_best" in v.headers and "brand_new_metric_s" in v.headers
    assert "status ok" in v.caption  # the same in every row
    assert "bubble_frac" not in v.headers


def test_blocks_fit_the_width_and_headers_are_never_cut():
    df = sweep_2d()
    df["ttft_p99_ms"] = 1.0
    df["scheduler"] = ["pp-wan", "atlas+bubbletea"] * 4
    v = view(df, "a title")
    for width in (60, 80, 120, 200):
        for idx in blocks(v, width):
            assert idx[: v.keys] == list(range(v.keys))  # key columns repeated in every block
            if len(idx) > v.keys + 1:
                assert table_width([max(len(v.headers[i]), *(len(r[i]) for r in v.rows)) for i in idx]) <= width
        text = render(rich_tables(v, width), width)
        assert "…" not in text
        for h in v.headers:
            assert h in text, (width, h)
        assert max(len(line) for line in text.splitlines()) <= width
    assert len(blocks(v, 60)) > len(blocks(v, 200)) == 1


def test_columns_option_picks_and_names_the_fix():
    v = view(sweep_2d(), "t", ["gbps", "scheduler", "iteration_s"])
    assert v.headers == ["gbps", "scheduler", "iteration_s"]
    with pytest.raises(SpecError, match="no column nope"):
        view(sweep_2d(), "t", ["nope"])
    assert "run_id" in view(sweep_2d(), "t", ["all"]).headers


@pytest.mark.parametrize(("name", "value", "text"), [
    ("gpu_util", 0.7234, "72.3%"), ("gpu_util", 0.00031, "0.031%"), ("rel_error", -0.076, "-7.6%"),
    ("iteration_s", 0.000153, "0.000153"), ("iteration_s", 4.7e-05, "4.7e-05"),
    ("iteration_s", 40.29139, "40.29"), ("iteration_s", 44.0, "44.00"),
    ("tokens_per_s", 87833.7, "87,834"),
    ("gpus", 3456, "3456"), ("requests", 120000, "120,000"), ("scheduler", "atlas", "atlas"),
    ("ttft_p50_ms", float("nan"), ""),
])
def test_formats(name, value, text):
    assert fmt_value(name, value) == text

"""The backend comparison's arithmetic and its figure (the runs themselves are integration tests)."""

from __future__ import annotations

import pandas as pd

from bench.backend_compare import HEADER, compare
from testbed.figures.draw import draw_all
from testbed.results import write_csv


def frame(it: dict[str, float], served: float | None) -> pd.DataFrame:
    return pd.DataFrame([{"scheduler": s, "iteration_s": v, "gpu_util": 0.5 / v, "bubble_frac": 0.3,
                          "served_in_bubbles": served if "bubbletea" in s else None} for s, v in it.items()]
                        ).set_index("scheduler")


def test_ratios_are_other_over_base_and_missing_metrics_are_skipped(tmp_path):
    base = frame({"pp-wan": 1.6, "atlas+bubbletea": 0.6}, 0.13)
    other = frame({"pp-wan": 1.7, "atlas+bubbletea": 0.57}, 0.13)
    rows = compare(base, other, ("netns", "docker"))
    got = {(r[0], r[1]): float(r[6]) for r in rows}
    assert got[("pp-wan", "iteration_s")] == round(1.7 / 1.6, 4)
    assert got[("atlas+bubbletea", "gpu_util")] == round(0.6 / 0.57, 4)
    assert ("pp-wan", "served_in_bubbles") not in got and got[("atlas+bubbletea", "served_in_bubbles")] == 1.0
    write_csv(tmp_path / "backends.csv", HEADER, rows)
    paths = draw_all(tmp_path, tmp_path / "fig")
    assert [p.name for p in paths] == ["backends.png"] and paths[0].read_bytes()[:4] == b"\x89PNG"

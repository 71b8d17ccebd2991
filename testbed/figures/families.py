"""Which family is fastest where (bench/families_where.py's CSVs): per experiment, a latency x capacity grid
coloured by the fastest family by effective tokens/s (at the published token efficiencies, 1 for every family
here, the same ranking as by iteration time), the fastest synchronous family (pipeline or dp-wan: what wins once
DiLoCo's efficiency falls below the break-even), and that break-even efficiency."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from testbed.figures.style import SERIES_COLOURS, plt, save

FAMILIES = ("pipeline", "dp-wan", "diloco", "streaming-diloco")
COLOURS = dict(zip(FAMILIES, SERIES_COLOURS, strict=False))


def best_by_family(df: pd.DataFrame, column: str, high: bool) -> pd.DataFrame:
    """Per (latency, capacity, family) the strongest scheduler's row by `column` (high: larger is better)."""
    ok = df[df["status"] == "ok"].copy()
    ok[column] = ok[column].astype(float)
    idx = ok.groupby(["latency_ms", "gbps", "family"])[column].idxmax() if high else \
        ok.groupby(["latency_ms", "gbps", "family"])[column].idxmin()
    return ok.loc[idx]


def _grid(ax, df: pd.DataFrame, column: str, high: bool, title: str, families: tuple[str, ...] = FAMILIES) -> None:
    b = best_by_family(df[df["family"].isin(families)], column, high)
    lats, caps = sorted(df["latency_ms"].unique()), sorted(df["gbps"].unique())
    img = np.ones((len(lats), len(caps), 3))
    for i, lat in enumerate(lats):
        for j, cap in enumerate(caps):
            g = b[(b["latency_ms"] == lat) & (b["gbps"] == cap)].sort_values(column, ascending=not high)
            if g.empty:
                continue
            win, second = g.iloc[0], (g.iloc[1] if len(g) > 1 else None)
            img[i, j] = matplotlib_rgb(COLOURS[win["family"]])
            margin = (win[column] / second[column] if high else second[column] / win[column]) if second is not None \
                else float("nan")
            ax.text(j, i, f"{win['family']}\n{margin:.2f}x {second['family'] if second is not None else ''}",
                    ha="center", va="center", fontsize=6.5)
    ax.imshow(img, aspect="auto", alpha=0.55)
    ax.set_xticks(range(len(caps)), [f"{c:g}" for c in caps])
    ax.set_yticks(range(len(lats)), [f"{v:g}" for v in lats])
    ax.set_xlabel("WAN capacity, every link (Gbit/s)")
    ax.set_ylabel("one-way latency (ms)")
    ax.set_title(title, fontsize=9)


def _break_even(ax, df: pd.DataFrame) -> None:
    """The token efficiency below which the faster DiLoCo loses to the fastest synchronous family."""
    b = best_by_family(df, "tokens_per_s", True)
    lats, caps = sorted(df["latency_ms"].unique()), sorted(df["gbps"].unique())
    vals = np.full((len(lats), len(caps)), np.nan)
    for i, lat in enumerate(lats):
        for j, cap in enumerate(caps):
            g = b[(b["latency_ms"] == lat) & (b["gbps"] == cap)].set_index("family")["tokens_per_s"]
            lo = g[[f for f in ("diloco", "streaming-diloco") if f in g]]
            sync = g[[f for f in ("pipeline", "dp-wan") if f in g]]
            if len(lo) and len(sync):
                vals[i, j] = sync.max() / lo.max()
                ax.text(j, i, f"{vals[i, j]:.2f}", ha="center", va="center", fontsize=8)
    ax.imshow(vals, aspect="auto", cmap="Greens_r", vmin=0, vmax=1.5, alpha=0.6)
    ax.set_xticks(range(len(caps)), [f"{c:g}" for c in caps])
    ax.set_yticks(range(len(lats)), [f"{v:g}" for v in lats])
    ax.set_xlabel("WAN capacity, every link (Gbit/s)")
    ax.set_title("DiLoCo's break-even token efficiency\n(below it the best synchronous family is faster)",
                 fontsize=9)


def matplotlib_rgb(hex_colour: str) -> tuple[float, float, float]:
    h = hex_colour.lstrip("#")
    return tuple(int(h[k:k + 2], 16) / 255 for k in (0, 2, 4))  # type: ignore[return-value]


def draw_where(csvs: list[Path], path: Path) -> Path:
    """families-where.png: one row per experiment's CSV."""
    fig, axes = plt.subplots(len(csvs), 3, figsize=(13, 3.6 * len(csvs)), dpi=110, squeeze=False)
    for row, csv in zip(axes, csvs, strict=True):
        df = pd.read_csv(csv)
        name = str(df["experiment"].iloc[0])
        _grid(row[0], df, "effective_tokens_per_s", True, f"{name}: fastest by effective tokens/s and iteration time\n"
              "(published token efficiencies; margin over the next family)")
        _grid(row[1], df, "effective_tokens_per_s", True, f"{name}: fastest synchronous family\n(efficiency 1 by "
              "definition; margin over the other)", ("pipeline", "dp-wan"))
        _break_even(row[2], df)
    save(fig, path)
    return path

"""The planner's answer as one figure: the best effective tokens/s of every family over the sweep points, with
one site as the reference line (a bar per family when nothing is swept). Reads plan.csv rows only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.figures.style import SERIES_COLOURS, new, plt, save

FAMILY_ORDER = ("pipeline", "dp-wan", "diloco", "streaming-diloco", "hybrid")


def bests(plan: pd.DataFrame) -> pd.DataFrame:
    """Per sweep point and family, the row with the most effective tokens/s (several DCs only: one site is the
    reference), plus the best one-site row as family "one site"."""
    done = plan[plan["effective_tokens_per_s"].notna()].copy()
    if "sweep" not in done:
        done["sweep"] = ""
    done["sweep"] = done["sweep"].fillna("")
    multi = done[done["dcs"].str.contains("|", regex=False)]
    single = done[~done["dcs"].str.contains("|", regex=False)].assign(family="one site")
    rows = []
    for part in (multi, single):
        for _, g in part.groupby(["sweep", "family"], sort=False):
            rows.append(g.loc[g["effective_tokens_per_s"].idxmax()])
    return pd.DataFrame(rows)


def draw(plan: pd.DataFrame, path: Path) -> Path:
    """answer.png: effective tokens/s (millions) per family, over the sweep points or as bars."""
    b = bests(plan)
    points = list(dict.fromkeys(b["sweep"]))
    fams = [f for f in (*FAMILY_ORDER, "one site") if f in set(b["family"])]
    fig, ax = new((8, 4.5))
    for i, f in enumerate(fams):
        g = b[b["family"] == f].set_index("sweep").reindex(points)
        ys = g["effective_tokens_per_s"].astype(float) / 1e6
        kw = {"color": "k", "linestyle": "--"} if f == "one site" else {"color": SERIES_COLOURS[i % 5]}
        if len(points) > 1:
            ax.plot(range(len(points)), ys, marker="o", label=f, **kw)
        elif f == "one site":
            ax.axhline(float(ys.iloc[0]), label=f, **kw)
        else:
            ax.bar(i, float(ys.iloc[0]), color=kw["color"], edgecolor="k", label=f)
    if len(points) > 1:
        ax.set_xticks(range(len(points)), [p.replace(";", "\n") for p in points], fontsize=7)
    else:
        ax.set_xticks([i for i, f in enumerate(fams) if f != "one site"], [f for f in fams if f != "one site"])
    ax.set_ylabel("best effective tokens/s (millions)")
    ax.set_ylim(bottom=0)
    ax.set_title("The best plan of every family (several DCs) against one site", fontsize=10)
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
    save(fig, path)
    plt.close("all")
    return path

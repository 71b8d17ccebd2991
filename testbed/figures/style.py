"""One look for every figure: colours per scheduler and per interval kind."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KIND_COLOURS = {"fwd": "#4C72B0", "bwd": "#55A868", "allreduce": "#8172B2", "prefill": "#DD8452",
                "optimizer": "#CCB974", "idle": "#EEEEEE", "send": "#C44E52", "recv": "#937860", "fill": "#8C8C8C"}
SCHED_COLOURS = {"dp-wan": "#8c8c8c", "pp-wan": "#C44E52", "pp-wan+mtcp": "#DD8452", "pp-wan+temporal": "#CCB974",
                 "atlas": "#4C72B0", "atlas+bubbletea": "#55A868", "pp-wan+bubbletea": "#937860"}

SERIES_COLOURS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2"]  # for series that are not schedulers


def colour(sched: str) -> str:
    return SCHED_COLOURS.get(sched, "#64B5CD")


def new(figsize=(7, 4.2)):
    fig, ax = plt.subplots(figsize=figsize, dpi=120)
    ax.grid(True, alpha=0.3)
    return fig, ax


def labelled_bars(ax, xs, vals, width: float, digits: int, **bar_kw) -> None:
    """Bars with their value written on top."""
    ax.bar(xs, vals, width, edgecolor="k", **bar_kw)
    for x, v in zip(xs, vals, strict=True):
        ax.text(x, v, f"{v:.{digits}f}", ha="center", va="bottom", fontsize=7)


def save(fig, path, tight: bool = True) -> None:
    """Write the PNG atomically (figures made with layout="constrained" pass tight=False)."""
    from testbed.results import atomic_open

    if tight:
        fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)

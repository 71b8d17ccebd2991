"""Figures of launched jobs and of packet captures: loss against wall time (DiLoCo vs DDP), and who
carried each WAN direction, millisecond by millisecond (flows.csv from a capture)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.figures.style import SERIES_COLOURS, new, plt, save


def loss_vs_wall(runs: dict[str, list[dict]], target: float, path: Path) -> Path:
    fig, ax = new()
    for i, (method, rows) in enumerate(runs.items()):
        ev = [(float(r["wall_s"]), float(r["eval_loss"])) for r in rows if r.get("eval_loss") not in (None, "")]
        c = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        ax.plot([float(r["wall_s"]) for r in rows], [float(r["loss"]) for r in rows], color=c, alpha=0.3, lw=1)
        if ev:
            ax.plot(*zip(*ev, strict=True), "o-", color=c, label=f"{method} (held-out)")
    ax.axhline(target, color="k", ls="--", lw=1, label=f"target {target:g}")
    ax.set_xlabel("wall-clock time on the emulated WAN (s)")
    ax.set_ylabel("loss (cross-entropy)")
    ax.set_title("Same model and data: loss against wall time")
    ax.legend(fontsize=8)
    save(fig, path)
    return path


def contention_window(flows: pd.DataFrame, span_ms: int = 200, by: str = "replica") -> tuple[int, int] | None:
    """The span_ms window of the busiest direction with the most milliseconds in which two or more
    replicas carried bytes: where taking turns, or not, shows."""
    d = flows[~flows[by].astype(str).isin(["", "nan"])]
    if d.empty:
        return None
    link, towards = d.groupby(["link", "towards"]).bytes.sum().idxmax()
    d = d[(d.link == link) & (d.towards == towards)]
    per = d.groupby("t_ms")[by].nunique()
    both = (per >= 2).astype(int).reindex(range(int(per.index.min()), int(per.index.max()) + 1), fill_value=0)
    if both.sum() == 0:
        return None
    end = int(both.rolling(span_ms, min_periods=1).sum().idxmax())
    return end - span_ms + 1, end + 1


def captured_flows(flows: pd.DataFrame, path: Path, max_panels: int = 4, by: str = "replica",
                   window_ms: tuple[int, int] | None = None, capacity_mbps: dict[str, float] | None = None) -> Path:
    """Throughput per replica on the busiest WAN directions, 1 ms bins, stacked: under temporal sharing
    one colour fills the link at a time; under fair sharing the colours share it. `window_ms`: zoom;
    `capacity_mbps`: each link's emulated capacity, drawn as a dashed line."""
    if window_ms is not None:
        flows = flows[(flows.t_ms >= window_ms[0]) & (flows.t_ms < window_ms[1])]
    d = flows.assign(key=flows[by].fillna("other").astype(str).replace({"": "other", "nan": "other"}))
    busiest = d.groupby(["link", "towards"]).bytes.sum().sort_values(ascending=False).index[:max_panels]
    fig, axes = plt.subplots(len(busiest), 1, figsize=(9, 1.9 * len(busiest) + 0.8), dpi=120, sharex=True,
                             squeeze=False)
    keys = sorted(d.key.unique())
    for ax, (link, towards) in zip(axes[:, 0], busiest, strict=True):
        x = d[(d.link == link) & (d.towards == towards)].pivot_table(index="t_ms", columns="key", values="bytes",
                                                                     aggfunc="sum", fill_value=0)
        x = x.reindex(range(int(x.index.min()), int(x.index.max()) + 1), fill_value=0)
        mbps = x * 8 / 1e-3 / 1e6
        ax.stackplot(mbps.index, *[mbps[k] if k in mbps else 0 * mbps.index for k in keys], step="post", lw=0,
                     colors=[SERIES_COLOURS[i % len(SERIES_COLOURS)] for i in range(len(keys))],
                     labels=[f"{by} {k}" for k in keys])
        if capacity_mbps and link in capacity_mbps:
            ax.axhline(capacity_mbps[link], color="k", ls="--", lw=1, label="link capacity")
        ax.set_ylabel("Mbit/s")
        ax.set_title(f"{link}, towards {towards}", fontsize=8)
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time (ms, 1 ms bins)")
    fig.suptitle("Who carries the WAN, millisecond by millisecond (packet capture, emulated rates)", fontsize=9)
    save(fig, path)
    return path

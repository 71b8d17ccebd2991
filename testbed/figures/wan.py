"""A WAN that changes: each link direction's throughput over the run, simulated and emulated, with the
link's capacity and its outages from the schedule (linkrates.csv, linkchanges.csv, iterations.csv)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.figures.style import SERIES_COLOURS, plt, save


def link_throughput(rates: pd.DataFrame, changes: pd.DataFrame, iterations: pd.DataFrame | None, run_id: str,
                    path: Path) -> Path:
    """One panel per link direction that carried traffic: the simulator's throughput (steps), the emulator's
    (20 ms bins, real-world rates), the scheduled capacity (dashed) and the outages (shaded)."""
    d = rates[rates.run_id == run_id]
    ch = changes[(changes.run_id == run_id) & (changes.source == "sim")].sort_values("t_s")
    links = [n for n in dict.fromkeys(d.link) if d[d.link == n].gbps.max() > 0]
    end = d.t_s.max()
    if iterations is not None and len(iterations):
        it = iterations[iterations.run_id == run_id]
        end = float((it.start_s + it.iteration_s).max())
    fig, axes = plt.subplots(len(links), 1, figsize=(8, 1.9 * len(links) + 1.0), dpi=120, sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], links, strict=True):
        pair = set(name.split(">"))
        mine = ch[ch.link.map(lambda s, p=pair: set(s.split("-")) == p)]
        for k, (src, g) in enumerate(d[d.link == name].groupby("source", sort=False)):
            g = g.sort_values("t_s")
            ax.step(list(g.t_s) + [end], list(g.gbps) + [g.gbps.iloc[-1]], where="post", lw=1,
                    color=SERIES_COLOURS[k], label="simulated" if src == "sim" else "emulated")
        if len(mine):  # the state each link starts in (t_s 0), then every change
            cap = list(mine.gbps.where(mine.up == 1, 0.0))
            ax.step(list(mine.t_s) + [end], cap + [cap[-1]], where="post", ls="--", lw=0.8, color="k",
                    label="scheduled capacity")
            downs = mine[mine.up == 0]
            for _, row in downs.iterrows():
                later = mine[(mine.t_s > row.t_s) & (mine.up == 1)]
                ax.axvspan(row.t_s, later.t_s.iloc[0] if len(later) else end, color="#C44E52", alpha=0.15, lw=0)
        if iterations is not None:
            for t in iterations[(iterations.run_id == run_id) & (iterations.source == "sim")].start_s[1:]:
                ax.axvline(t, color="#999999", lw=0.5, ls=":")
        ax.set_ylabel("Gbit/s")
        ax.set_title(name.replace(">", " -> "), fontsize=8)
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time in the run's timeline (s); dotted: the simulator's iteration starts; red: link down")
    fig.suptitle(f"{run_id}: WAN throughput on a changing WAN", fontsize=9)
    save(fig, path)
    return path

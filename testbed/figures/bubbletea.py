"""BubbleTea figures: TTFT CDFs (bubble- vs pool-served), utilisation and goodput against offered
load with the knee marked, and one iteration's Gantt with prefill in the bubbles (simulated and
emulated side by side)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.figures.style import KIND_COLOURS, SERIES_COLOURS, colour, new, plt, save
from testbed.net.units import s_to_ms


def ttft_cdf(requests: pd.DataFrame, path: Path, slo_ms: float | None = None, title: str = "") -> Path:
    """TTFT CDF per run, bubble-served (solid) and pool-served (dashed, queueing included) apart."""
    fig, ax = new()
    for (run_id, d), c in zip(requests.groupby("run_id", sort=False), SERIES_COLOURS * 4, strict=False):
        for served, style, what in ((1, "-", "bubbles"), (0, "--", "pool")):
            t = s_to_ms(d[d.in_bubble == served].ttft_s).sort_values().to_numpy()
            if len(t):
                ax.plot(t, [(i + 1) / len(t) for i in range(len(t))], style, color=c,
                        label=f"{run_id}: {what} ({len(t) / len(d):.0%} of {len(d)})")
    if slo_ms:
        ax.axvline(slo_ms, color="k", ls=":", lw=1, label=f"SLO {slo_ms:g} ms")
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (ms, pool: queueing included)")
    ax.set_ylabel("share of those requests")
    ax.set_title(title or "TTFT CDF: served in bubbles vs by the fallback pool")
    ax.legend(fontsize=6)
    save(fig, path)
    return path


def load_sweep(summary: pd.DataFrame, knees: pd.DataFrame, path: Path) -> Path:
    """Per BubbleTea scheduler, against offered requests/s: GPU utilisation as time occupancy and as
    useful work (top), goodput and SLO attainment (bottom); the knee is the dotted line."""
    d = summary[summary.request_rate.notna()]
    fig, (top, bot) = plt.subplots(2, 1, figsize=(7.5, 6.4), dpi=120, sharex=True)
    for ax in (top, bot):
        ax.grid(True, alpha=0.3)
    att = bot.twinx()
    for sched, g in d.groupby("scheduler", sort=False):
        g = g.sort_values("request_rate")
        c = colour(sched)
        top.plot(g.request_rate, g.gpu_util, "o-", color=c, label=f"{sched}: time occupancy")
        top.plot(g.request_rate, g.useful_util, "s--", color=c, label=f"{sched}: useful work")
        top.plot(g.request_rate, g.train_util, ":", color=c, label=f"{sched}: training alone")
        bot.plot(g.request_rate, g.goodput_rps, "o-", color=c, label=f"{sched}: goodput")
        att.plot(g.request_rate, g.slo_attainment, "x:", color=c, label=f"{sched}: SLO attainment")
        k = knees[knees.scheduler == sched] if len(knees) else knees
        if len(k) and pd.notna(k.knee_request_rate.iloc[0]):
            x = float(k.knee_request_rate.iloc[0])
            for ax in (top, bot):
                ax.axvline(x, color=c, ls="-.", lw=1)
            top.annotate(f"knee {x:.0f}/s", (x, 1.0), textcoords="offset points", xytext=(3, -10), fontsize=7,
                         color=c)
    lim = [0, d.request_rate.max() * 1.05]
    bot.plot(lim, lim, color="#999999", lw=0.8, label="offered (all on time)")
    top.set_ylim(0, 1.02)
    top.set_ylabel("share of GPU time")
    top.set_title("BubbleTea against offered load (knee: >= 99 % on time, training slowed < 1 %)", fontsize=9)
    top.legend(fontsize=6, ncol=2, loc="lower right")
    bot.set_ylabel("goodput (requests/s on time)")
    bot.set_xlabel("offered prefill requests per second")
    att.set_ylabel("SLO attainment")
    att.set_ylim(0, 1.05)
    h1, l1 = bot.get_legend_handles_labels()
    h2, l2 = att.get_legend_handles_labels()
    bot.legend(h1 + h2, l1 + l2, fontsize=6, loc="upper left")
    save(fig, path)
    return path


def _gantt_rows(ax, d: pd.DataFrame, t0: float) -> None:
    stages = sorted(d.stage.unique())
    for kind in ("fwd", "bwd", "allreduce", "prefill"):
        k = d[d.kind == kind]
        for s in stages:
            ks = k[k.stage == s]
            if len(ks):
                ax.broken_barh(list(zip(ks.start_s - t0, ks.end_s - ks.start_s, strict=True)), (s - 0.4, 0.8),
                               color=KIND_COLOURS[kind], label=kind if s == stages[0] else None)
    dcs = d.groupby("stage").dc.first()
    ax.set_yticks(stages, [f"s{s} ({dcs[s]})" for s in stages], fontsize=7)
    ax.invert_yaxis()
    ax.grid(True, alpha=0.3)


def gantt_pair(timeline: pd.DataFrame, run_id: str, path: Path, replica: int = 0) -> Path:
    """One iteration of one replica, the simulator's prediction above the emulated run (each from its
    own iteration start): prefill (orange) sits in the white bubbles between training ops."""
    runs = timeline[(timeline.run_id == run_id) & (timeline.replica == replica)]
    sources = [s for s in ("sim", "emu") if s in set(runs.source)]
    fig, axes = plt.subplots(len(sources), 1, figsize=(9, 1.0 + 1.4 * len(sources) * runs.stage.nunique() / 3),
                             dpi=120, sharex=True, squeeze=False)
    for ax, src in zip(axes[:, 0], sources, strict=True):
        d = runs[runs.source == src]
        its = sorted(d.iteration.unique())
        it = its[1] if len(its) > 1 else its[0]  # a steady iteration
        d = d[d.iteration == it]
        busy = d[d.kind.isin(["fwd", "bwd", "allreduce", "prefill"])]
        _gantt_rows(ax, d, float(busy.start_s.min()) if len(busy) else 0.0)
        n = (d.kind == "prefill").sum()
        ax.set_title(f"{'simulated' if src == 'sim' else 'emulated'}: iteration {it}, replica {replica}, "
                     f"{n} prefill job(s)", fontsize=8)
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(dict(zip(labels, handles, strict=True)).values(), dict(zip(labels, handles, strict=True)).keys(),
                  fontsize=6, loc="lower right", ncol=4)
    axes[-1, 0].set_xlabel("time since the iteration's first op (s)")
    fig.suptitle(f"{run_id}: prefill in the bubbles (white = idle)", fontsize=9)
    save(fig, path)
    return path

"""Training figures for one sweep point or a fixed x: bars per scheduler, utilization, TTFT CDFs, WAN flows,
multi-TCP, loss, backends. Sweep-aware line figures are in figures/sweep.py, Gantt charts in figures/gantt.py."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.ticker import FuncFormatter

from testbed.figures.style import KIND_COLOURS, SERIES_COLOURS, colour, labelled_bars, new, plt, save
from testbed.net.units import bps_to_gbps, bytes_s_to_bps, s_to_ms


def iteration_bars(summary: pd.DataFrame, path: Path, title: str = "") -> Path:
    """One sweep point: iteration time per scheduler, with the lower bound (the same placement, ideal WAN)."""
    d = summary.groupby("scheduler", sort=False).mean(numeric_only=True)
    fig, ax = new()
    x = list(range(len(d)))
    labelled_bars(ax, x, d.iteration_s.tolist(), 0.6, 3, color=[colour(s) for s in d.index])
    if "lower_bound_s" in d:
        ax.scatter(x, d.lower_bound_s, marker="_", s=900, color="k", zorder=3, label="lower bound (ideal WAN)")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    ax.set_xticks(x, d.index, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("iteration time (s)")
    ax.set_title(f"{title}: iteration time" if title else "iteration time")
    save(fig, path)
    return path


def gpu_utilization(summary: pd.DataFrame, path: Path) -> Path:
    """One sweep point, stacked per scheduler (and source): training compute, prefill (BubbleTea), the rest."""
    two = "source" in summary and summary.source.nunique() > 1
    keys = summary.scheduler + (" (" + summary.source.map({"sim": "simulated", "emu": "emulated"}).fillna(
        summary.source) + ")" if two else "")
    d = summary.assign(_k=keys).groupby("_k", sort=False).mean(numeric_only=True)
    train = d.train_util if "train_util" in d else d.gpu_util
    prefill = d.prefill_util.fillna(0) if "prefill_util" in d else train * 0
    fig, ax = new()
    x = range(len(d))
    ax.bar(x, train, color=KIND_COLOURS["fwd"], label="training")
    ax.bar(x, prefill, bottom=train, color=KIND_COLOURS["prefill"], label="prefill (BubbleTea)")
    ax.bar(x, 1 - train - prefill, bottom=train + prefill, color="#DDDDDD", label="idle / communication")
    for i, (t, p) in enumerate(zip(train, prefill, strict=True)):
        ax.text(i, t + p + 0.01, f"{t + p:.0%}", ha="center", fontsize=8)
    ax.set_xticks(list(x), d.index, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("share of GPU time (%)")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:.0%}"))
    ax.set_title("GPU utilization")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    save(fig, path)
    return path


def multitcp(summary: pd.DataFrame, path: Path) -> Path:
    """Throughput vs TCP connections per RTT: emulated points (the workers' connections filled, iperf3's hollow),
    simulator model as lines."""
    fig, ax = new()
    for (lat, d), c in zip(summary.groupby("wan_latency_ms"), SERIES_COLOURS * 4, strict=False):
        sim = d[d.source == "sim"].sort_values("tcp_connections")
        emu = d[d.source == "emu"].sort_values("tcp_connections")
        plain = d[d.source == "emu-iperf3"].sort_values("tcp_connections")
        ax.plot(sim.tcp_connections, sim.throughput_mbps, "-", color=c, label=f"model, RTT {2 * lat:g} ms")
        ax.plot(emu.tcp_connections, emu.throughput_mbps, "o", color=c, label=f"emulated, RTT {2 * lat:g} ms")
        if len(plain):
            ax.plot(plain.tcp_connections, plain.throughput_mbps, "o", mfc="none", color=c,
                    label=f"iperf3 (unclamped), RTT {2 * lat:g} ms")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("parallel TCP connections")
    ax.set_ylabel("throughput (Mbit/s)")
    ax.set_title(f"One WAN link, window {summary.window_kib.iloc[0]:g} KiB: emulated vs model")
    ax.legend(fontsize=7, ncol=2)
    save(fig, path)
    return path


def ttft_cdfs(requests: pd.DataFrame, summary: pd.DataFrame, keys: list[str], path: Path,
              slo_ms: float | None = None) -> Path:
    """TTFT CDF of every sweep point: one panel per scheduler (and source), one line per point."""
    from matplotlib import colormaps

    from testbed.analysis.sweep import short_names

    short = short_names(keys)
    where = summary.set_index(["run_id", "source"]) if "source" in summary else summary.set_index("run_id")
    groups = list(requests.assign(sched=requests.run_id.str.split("-", n=1).str[1]).groupby(["sched", "source"],
                                                                                             sort=False))
    fig, axes = plt.subplots(1, len(groups), figsize=(4.6 * len(groups) + 2.2, 3.8), dpi=120, sharey=True,
                             squeeze=False, layout="constrained")
    for ax, ((sched, src), d) in zip(axes[0], groups, strict=True):
        runs = list(dict.fromkeys(d.run_id))
        cmap = colormaps["viridis"]
        for i, run_id in enumerate(runs):
            g = d[d.run_id == run_id]
            t = s_to_ms(g.ttft_s).sort_values().to_numpy()
            row = where.loc[(run_id, src)] if isinstance(where.index, pd.MultiIndex) else where.loc[run_id]
            point = ", ".join(f"{short[k]}={row[k]:g}" if isinstance(row[k], float) else f"{short[k]}={row[k]}"
                              for k in keys if k in row and summary[k].nunique() > 1)
            ax.plot(t, [(j + 1) / len(t) for j in range(len(t))], color=cmap(i / max(1, len(runs) - 1) * 0.9),
                    label=f"{point or run_id}: {g.in_bubble.mean():.0%} in bubbles")
        if slo_ms:
            ax.axvline(slo_ms, color="k", ls="--", lw=1, label=f"TTFT SLO {slo_ms:g} ms")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
        ax.set_xlabel("time to first token (ms)")
        ax.set_title(f"{sched} ({'simulated' if src == 'sim' else 'emulated'})", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(True, alpha=0.3)
    axes[0, 0].set_ylabel("share of requests")
    many = requests.run_id.str.split("-", n=1).str[0].nunique() > 1
    fig.suptitle(f"TTFT CDF{' per sweep point' if many else ''} (bubble-served and fallback requests together)",
                 fontsize=10)
    save(fig, path, tight=False)
    return path


def util_vs_rate(summary: pd.DataFrame, path: Path) -> Path:
    """GPU utilization (training + prefill) vs offered request rate, per BubbleTea scheduler and source."""
    fig, ax = new()
    d = summary[summary.request_rate.notna()]
    d = d.assign(source=d.source if "source" in d else "sim")
    two = d.source.nunique() > 1
    for (sched, src), g in d.groupby(["scheduler", "source"], sort=False):
        g = g.sort_values("request_rate")
        name = f"{sched} ({'simulated' if src == 'sim' else 'emulated'})" if two else sched
        ls = "-" if src == "sim" else "--"
        ax.plot(g.request_rate, g.gpu_util, "o", ls=ls, color=colour(sched), label=f"{name}: training + prefill")
        ax.plot(g.request_rate, g.train_util, ":", color=colour(sched), label=f"{name}: training only")
    ax.set_xlabel("offered prefill requests per second")
    ax.set_ylabel("GPU utilization")
    ax.set_ylim(0, 1.02)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:.0%}"))
    ax.set_title("BubbleTea: utilization vs request rate")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    save(fig, path)
    return path


def sim_vs_emu(summary: pd.DataFrame, path: Path) -> Path:
    """Iteration time per scheduler: emulated (measured) next to the simulator's prediction."""
    fig, ax = new()
    scheds = list(dict.fromkeys(summary.scheduler))
    x = range(len(scheds))
    for off, src, hatch in ((-0.2, "sim", ""), (0.2, "emu", "//")):
        d = summary[summary.source == src].groupby("scheduler").iteration_s.mean()
        vals = [d.get(s, float("nan")) for s in scheds]
        labelled_bars(ax, [i + off for i in x], vals, 0.4, 2, color=[colour(s) for s in scheds], hatch=hatch,
                      label="simulated" if src == "sim" else "emulated (measured)")
    ax.set_xticks(list(x), scheds, rotation=15, fontsize=8)
    ax.set_ylabel("iteration time (s)")
    ax.set_title("Emulated vs simulated, same configuration")
    ax.legend(fontsize=8)
    save(fig, path)
    return path


FLOW_MIN_SAMPLES = 8  # fewer samples of an iteration than this cannot show replicas taking turns


def flow_sampling(flows: pd.DataFrame, run_id: str) -> tuple[int, float]:
    """(fewest samples of any WAN direction and replica, median interval between samples in s)."""
    d = flows[flows.run_id == run_id]
    g = d.sort_values("t_s").groupby(["link", "towards", "replica"]).t_s
    counts = g.nunique()
    gaps = g.diff().dropna()
    return int(counts.min()) if len(counts) else 0, float(gaps.median()) if len(gaps) else float("nan")


def wan_flows(flows: pd.DataFrame, run_id: str, path: Path, t0: float | None = None) -> Path:
    """Per-replica throughput on each WAN direction over one emulated iteration (from HTB counters), with
    every replica's sum and the link's capacity, in real-world Gbit/s. Each rate is the mean over the
    interval before its sample, so it is drawn as a step ending at the sample."""
    d = flows[flows.run_id == run_id]
    pairs = list(dict.fromkeys(zip(d.link, d.towards, strict=True)))[:4]
    fig, axes = plt.subplots(len(pairs), 1, figsize=(9, 1.9 * len(pairs) + 0.9), dpi=120, sharex=True, squeeze=False,
                             layout="constrained")
    it = int(d.iteration.iloc[0]) if "iteration" in d and len(d) else 0
    start = d.t_s.min() if t0 is None else t0
    handles: dict[str, object] = {}
    for ax, (link, towards) in zip(axes[:, 0], pairs, strict=True):
        dd = d[(d.link == link) & (d.towards == towards)]
        total = None
        for (r, g), c in zip(dd.groupby("replica"), SERIES_COLOURS * 4, strict=False):
            g = g.sort_values("t_s")
            rate = bps_to_gbps(bytes_s_to_bps(g.wire_bytes.diff()) * g.scale / g.t_s.diff()).to_numpy()
            (h,) = ax.plot(g.t_s - start, rate, lw=1.2, color=c, drawstyle="steps-pre", label=f"replica {r}")
            handles.setdefault(f"replica {r}", h)
            s = pd.Series(rate, index=g.t_s.round(4).to_numpy())
            total = s if total is None else total.add(s, fill_value=0)
        if total is not None and dd.replica.nunique() > 1:
            (h,) = ax.plot(total.index - start, total.to_numpy(), lw=0.8, color="0.45", ls=":", drawstyle="steps-pre",
                           label="all replicas")
            handles.setdefault("all replicas", h)
        if "link_gbps" in dd and dd.link_gbps.notna().any():
            cap = float(dd.link_gbps.iloc[0])
            h = ax.axhline(cap, color="k", lw=1.2, ls="--")
            handles.setdefault("link capacity", h)
            ax.set_ylim(0, cap * 1.15)
        ax.set_ylabel("Gbit/s")
        ax.set_title(f"{link}, towards {towards}", fontsize=8, loc="left")
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel(f"time since iteration {it}'s start (s)" if t0 is not None
                           else f"time since the first sample of iteration {it} (s)")
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center", fontsize=7,
               ncol=len(handles))
    n, gap = flow_sampling(flows, run_id)
    fig.suptitle(f"{run_id}: who has the WAN in iteration {it} (real-world rates from HTB class counters, "
                 f"one sample every {s_to_ms(gap):.0f} ms)", fontsize=9)
    save(fig, path, tight=False)
    return path


def loss_curve(loss: pd.DataFrame, path: Path) -> Path:
    """Training loss per iteration of torch-compute emulated runs."""
    fig, ax = new()
    for run_id, d in loss.groupby("run_id", sort=False):
        ax.plot(d.iteration, d.loss, "o-", label=run_id)
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss (cross-entropy)")
    ax.set_title("Real training across the emulated WAN")
    ax.legend(fontsize=8)
    save(fig, path)
    return path


def backends(cmp: pd.DataFrame, path: Path, metric: str = "iteration_s") -> Path:
    """The same emulated experiment on each backend (bench/backend_compare.py's backends.csv)."""
    d = cmp[cmp.metric == metric]
    scheds = list(dict.fromkeys(d.scheduler))
    base = d.groupby("scheduler").first()
    names = [base.base_backend.iloc[0], *dict.fromkeys(d.other_backend)]
    vals = {names[0]: [base.at[s, "base"] for s in scheds]}
    for b in names[1:]:
        x = d[d.other_backend == b].set_index("scheduler")["other"]
        vals[b] = [x.get(s, float("nan")) for s in scheds]
    fig, ax = new()
    w = 0.8 / len(names)
    for k, b in enumerate(names):
        xs = [i - 0.4 + w * (k + 0.5) for i in range(len(scheds))]
        labelled_bars(ax, xs, vals[b], w, 3, label=b, color=SERIES_COLOURS[k % len(SERIES_COLOURS)])
    ax.set_xticks(range(len(scheds)), scheds, fontsize=8)
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title("Same experiment, every backend (emulated)")
    ax.legend(fontsize=8)
    save(fig, path)
    return path

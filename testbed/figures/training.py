"""Training figures: iteration time and speedup vs WAN latency, GPU utilization, Gantt chart."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.figures.style import KIND_COLOURS, SERIES_COLOURS, colour, labelled_bars, new, plt, save


def iteration_vs_latency(summary: pd.DataFrame, path: Path) -> Path:
    fig, ax = new()
    for sched, d in summary.groupby("scheduler", sort=False):
        d = d.sort_values("wan_latency_ms")
        ax.plot(d.wan_latency_ms, d.iteration_s, "o-", label=sched, color=colour(sched))
    lb = summary.groupby("wan_latency_ms").lower_bound_s.min()
    ax.plot(lb.index, lb.values, "k--", lw=1, label="lower bound (no WAN penalty)")
    ax.set_xlabel("one-way WAN latency (ms)")
    ax.set_ylabel("iteration time (s)")
    ax.set_yscale("log")
    ax.set_title(f"{summary.model.iloc[0]} on {summary.gpus.iloc[0]} GPUs: iteration time")
    ax.legend(fontsize=8)
    save(fig, path)
    return path


def speedup(summary: pd.DataFrame, path: Path, x: str = "wan_latency_ms", xlabel: str = "one-way WAN latency (ms)"):
    atlas = summary[summary.scheduler == "atlas"].set_index(x).iteration_s
    fig, ax = new()
    for base in ("pp-wan", "dp-wan"):
        b = summary[summary.scheduler == base].set_index(x).iteration_s
        if b.empty or atlas.empty:
            continue
        s = (b / atlas).dropna().sort_index()
        ax.plot(s.index, s.values, "o-", color=colour(base), label=f"atlas over {base}")
        for xi, yi in s.items():
            ax.annotate(f"{yi:.1f}x", (xi, yi), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("speedup (iteration time ratio)")
    ax.set_title("Atlas speedup")
    ax.legend(fontsize=8)
    save(fig, path)
    return path


def gpu_utilization(summary: pd.DataFrame, path: Path) -> Path:
    """Stacked per scheduler: training compute, prefill (BubbleTea), idle/communication."""
    d = summary.groupby("scheduler", sort=False).mean(numeric_only=True)
    train = d.train_util if "train_util" in d else d.gpu_util
    prefill = d.prefill_util if "prefill_util" in d else train * 0
    fig, ax = new()
    x = range(len(d))
    ax.bar(x, train, color=KIND_COLOURS["fwd"], label="training")
    ax.bar(x, prefill, bottom=train, color=KIND_COLOURS["prefill"], label="prefill (BubbleTea)")
    ax.bar(x, 1 - train - prefill, bottom=train + prefill, color="#DDDDDD", label="idle / communication")
    for i, (t, p) in enumerate(zip(train, prefill, strict=True)):
        ax.text(i, t + p + 0.01, f"{t + p:.0%}", ha="center", fontsize=8)
    ax.set_xticks(list(x), d.index, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("share of GPU time")
    ax.set_title("GPU utilization (mean over sweep points)")
    ax.legend(fontsize=8, loc="upper left")
    save(fig, path)
    return path


def gantt(timeline: pd.DataFrame, run_id: str, path: Path, replica: int = 0, iteration: int | None = None,
          title_suffix: str = "") -> Path:
    """Stages x time for one replica of one iteration; bubbles are the white gaps."""
    if iteration is None:
        iteration = int(timeline[timeline.run_id == run_id].iteration.min())
    d = timeline[(timeline.run_id == run_id) & (timeline.replica == replica) & (timeline.iteration == iteration)]
    stages = sorted(d.stage.unique())
    fig, ax = new((9, 0.35 * len(stages) + 1.6))
    for kind in ("fwd", "bwd", "allreduce", "prefill"):
        k = d[d.kind == kind]
        for s in stages:
            ks = k[k.stage == s]
            if len(ks):
                ax.broken_barh(list(zip(ks.start_s, ks.end_s - ks.start_s, strict=True)), (s - 0.4, 0.8),
                               color=KIND_COLOURS[kind], label=kind if s == stages[0] else None)
    dcs = d.groupby("stage").dc.first()
    ax.set_yticks(stages, [f"s{s} ({dcs[s]})" for s in stages], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(f"{run_id}{title_suffix}: iteration {iteration}, replica {replica} (white = bubble)")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles, strict=True))
    ax.legend(uniq.values(), uniq.keys(), fontsize=7, loc="lower right", ncol=4)
    save(fig, path)
    return path


def multitcp(summary: pd.DataFrame, path: Path) -> Path:
    """Throughput vs TCP connections per RTT: emulated points, simulator model as lines."""
    fig, ax = new()
    for (lat, d), c in zip(summary.groupby("wan_latency_ms"), SERIES_COLOURS * 4, strict=False):
        sim = d[d.source == "sim"].sort_values("tcp_connections")
        emu = d[d.source == "emu"].sort_values("tcp_connections")
        ax.plot(sim.tcp_connections, sim.throughput_mbps, "-", color=c, label=f"model, RTT {2 * lat:g} ms")
        ax.plot(emu.tcp_connections, emu.throughput_mbps, "o", color=c, label=f"emulated, RTT {2 * lat:g} ms")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("parallel TCP connections")
    ax.set_ylabel("throughput (Mbit/s)")
    ax.set_title(f"One WAN link, window {summary.window_kib.iloc[0]:g} KiB: emulated vs model")
    ax.legend(fontsize=7, ncol=2)
    save(fig, path)
    return path


def ttft_cdf(requests: pd.DataFrame, path: Path, slo_ms: float | None = None) -> Path:
    """TTFT CDF per run (bubble-served and fallback together)."""
    fig, ax = new()
    for run_id, d in requests.groupby("run_id", sort=False):
        t = (d.ttft_s * 1e3).sort_values().to_numpy()
        share = d.in_bubble.mean()
        ax.plot(t, [(i + 1) / len(t) for i in range(len(t))], label=f"{run_id} ({share:.0%} in bubbles)")
    if slo_ms:
        ax.axvline(slo_ms, color="k", ls="--", lw=1, label=f"SLO {slo_ms:g} ms")
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (ms)")
    ax.set_ylabel("share of requests")
    ax.set_title("TTFT CDF")
    ax.legend(fontsize=7)
    save(fig, path)
    return path


def util_vs_rate(summary: pd.DataFrame, path: Path) -> Path:
    """GPU utilization (training + prefill) vs offered request rate, per BubbleTea scheduler."""
    fig, ax = new()
    d = summary[summary.request_rate.notna()]
    for sched, g in d.groupby("scheduler", sort=False):
        g = g.sort_values("request_rate")
        ax.plot(g.request_rate, g.gpu_util, "o-", color=colour(sched), label=f"{sched}: training + prefill")
        ax.plot(g.request_rate, g.train_util, ":", color=colour(sched), label=f"{sched}: training only")
    ax.set_xlabel("offered prefill requests per second")
    ax.set_ylabel("GPU utilization")
    ax.set_ylim(0, 1.02)
    ax.set_title("BubbleTea: utilization vs request rate")
    ax.legend(fontsize=7)
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


def wan_flows(flows: pd.DataFrame, run_id: str, path: Path) -> Path:
    """Per-replica throughput on each WAN direction over one emulated iteration (from HTB counters)."""
    d = flows[flows.run_id == run_id]
    pairs = list(dict.fromkeys(zip(d.link, d.towards, strict=True)))[:4]
    fig, axes = plt.subplots(len(pairs), 1, figsize=(8, 1.9 * len(pairs) + 0.8), dpi=120, sharex=True, squeeze=False)
    for ax, (link, towards) in zip(axes[:, 0], pairs, strict=True):
        for r, g in d[(d.link == link) & (d.towards == towards)].groupby("replica"):
            g = g.sort_values("t_s")
            rate = g.wire_bytes.diff() * 8 * g.scale / g.t_s.diff() / 1e9
            ax.plot(g.t_s, rate, lw=1, label=f"replica {r}")
        ax.set_ylabel("Gbit/s")
        ax.set_title(f"{link}, towards {towards}", fontsize=8)
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time in the run's timeline (s)")
    fig.suptitle(f"{run_id}: who has the WAN (real-world rates, from HTB class counters)", fontsize=9)
    save(fig, path)
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

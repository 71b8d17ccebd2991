"""Draw every figure a results folder's CSVs support, and say why any other is not drawn.

A swept run gets one figure per metric with the swept key on x (figures/sweep.py); a single point gets
bars. A figure that would be empty or misleading is skipped with a note, which `testbed figures` and
`testbed report` print.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from testbed import columns as reg
from testbed.analysis.sweep import axes, short_names, with_sweep_columns
from testbed.figures import bubbletea, gantt, sweep, training
from testbed.net.units import gbps_to_mbps, s_to_ms

LINE_METRICS = ("iteration_s", "tokens_per_s_per_gpu", "gpu_util", "speedup_vs_best")  # each drawn if present
SERVING_METRICS = ("served_in_bubbles", "prefill_util", "ttft_p50_ms", "ttft_p99_ms", "slo_attainment")
MAX_PANELS = 12
MAX_GANTT_RUNS = 6


def read_summary(path: Path) -> pd.DataFrame:
    """summary.csv without its infeasible rows (a sweep point that could not run has no numbers to draw),
    parsed as if they had never been there."""
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    if "status" in raw:
        raw = raw[raw.status.isin(("ok", ""))]
    return pd.read_csv(io.StringIO(raw.to_csv(index=False)))


def draw_all(folder: Path, out: Path, notes: list[str] | None = None) -> list[Path]:
    """Every figure the CSVs in `folder` support, written to `out`; reasons for skipped ones go to `notes`."""
    folder, out = Path(folder), Path(out)
    notes = notes if notes is not None else []
    paths: list[Path] = []
    if (folder / "backends.csv").exists():  # bench/backend_compare.py: one run per backend in subfolders
        paths.append(training.backends(pd.read_csv(folder / "backends.csv"), out / "backends.png"))
        for sub in sorted(p for p in folder.iterdir() if (p / "summary.csv").exists()):
            paths += draw_all(sub, out / sub.name, notes)
    paths += _captured(folder, out, notes)
    rfile = folder / "linkrates.csv"
    if rfile.exists() and (folder / "linkchanges.csv").exists():  # a WAN that changes
        from testbed.figures.wan import link_throughput

        rates, changes = pd.read_csv(rfile), pd.read_csv(folder / "linkchanges.csv")
        ifile = folder / "iterations.csv"
        its = pd.read_csv(ifile) if ifile.exists() else None
        for run_id in list(dict.fromkeys(rates.run_id))[:8]:
            paths.append(link_throughput(rates, changes, its, run_id, out / f"wan_throughput_{run_id}.png"))
    sfile = folder / "summary.csv"
    if not sfile.exists():
        return paths
    summary = read_summary(sfile)
    if (folder / "loss.csv").exists():
        paths.append(training.loss_curve(pd.read_csv(folder / "loss.csv"), out / "loss.png"))
    if "throughput_mbps" in summary:  # a multi-TCP experiment
        return [*paths, training.multitcp(summary, out / "multitcp.png")]
    if summary.empty or "scheduler" not in summary or "iteration_s" not in summary:
        notes.append(f"{sfile}: no training rows, so no training figures")
        return paths
    df, keys = with_sweep_columns(summary)
    x, facets = axes(df, keys)
    if x is None:
        paths += _one_point(df, out, notes)
    else:
        paths += _swept(df, keys, x, facets, out, notes)
    paths += _serving(folder, df, keys, out, notes)
    paths += _flows(folder, out, notes)
    paths += _gantts(folder, df, keys, out, notes)
    if "timing_error" in summary and (summary.source == "emu").any():  # an emulated run's timing health
        from testbed.figures.health import timing_health

        vfile = folder / "validation.csv"
        paths.append(timing_health(summary, pd.read_csv(vfile) if vfile.exists() else None, out / "timing_health.png"))
    return paths


def _title(df: pd.DataFrame) -> str:
    parts = []
    if "model" in df and df.model.nunique() == 1:
        parts.append(str(df.model.iloc[0]))
    if "gpus" in df and df.gpus.nunique() == 1:
        parts.append(f"{int(df.gpus.iloc[0]):,} GPUs")
    if "dcs" in df and df.dcs.nunique() == 1:
        parts.append(f"{str(df.dcs.iloc[0]).count('|') + 1} DCs")
    return ", ".join(parts)


def _one_point(df: pd.DataFrame, out: Path, notes: list[str]) -> list[Path]:
    paths = []
    if "source" in df and "emu" in set(df.source):  # iteration time of both sources, side by side
        paths.append(training.sim_vs_emu(df, out / "sim_vs_emu.png"))
    else:
        paths.append(training.iteration_bars(df, out / "iteration_s.png", _title(df)))
    paths.append(training.gpu_utilization(df, out / "gpu_util.png"))
    return paths


def _swept(df: pd.DataFrame, keys: list[str], x: str, facets: list[str], out: Path, notes: list[str]) -> list[Path]:
    short = short_names(keys)
    ncombos = len(sweep.panels(df, facets))
    if ncombos > MAX_PANELS:
        notes.append(f"line figures: {ncombos} combinations of {', '.join(short[f] for f in facets)} would need "
                     f"{ncombos} panels (at most {MAX_PANELS}); sweep fewer keys, or read the table (testbed show)")
        return []
    by = f" per {', '.join(reg.words(f) for f in facets)}" if facets else ""
    paths = []
    for m in LINE_METRICS:
        if m in df and pd.to_numeric(df[m], errors="coerce").notna().any():
            p = out / f"{m}_vs_{short[x]}.png"
            paths.append(sweep.line_figure(df, m, x, facets, p, f"{_title(df)}: {reg.words(m)}{by}",
                                           ref=1.0 if reg.unit(m) == "x" else None))
    sp = sweep.speedup_values(df, [x, *facets])
    if sp is not None:
        others = df.scheduler != "atlas"
        p = out / f"speedup_vs_{short[x]}.png"
        paths.append(sweep.line_figure(df[others], "speedup", x, facets, p,
                                       f"{_title(df)}: Atlas's speedup over each scheduler{by}",
                                       values=sp[others], ref=1.0))
    else:
        notes.append("speedup figure: needs `atlas` and at least one other scheduler in the run")
    bt = df[df.scheduler.astype(str).str.contains(r"\+bubbletea")]
    for m in SERVING_METRICS if not bt.empty else ():
        if m in bt and pd.to_numeric(bt[m], errors="coerce").notna().any():
            p = out / f"{m}_vs_{short[x]}.png"
            paths.append(sweep.line_figure(bt, m, x, facets, p, f"BubbleTea: {reg.words(m)}{by}"))
    swept = ", ".join(short[k] for k in keys)
    notes.append(f"gpu_util.png (bars per scheduler) skipped: a mean over the sweep of {swept} would hide what "
                 f"the sweep shows; gpu_util_vs_{short[x]}.png has every point")
    return paths


def _serving(folder: Path, df: pd.DataFrame, keys: list[str], out: Path, notes: list[str]) -> list[Path]:
    if "request_rate" not in df or not pd.to_numeric(df.request_rate, errors="coerce").notna().any():
        return []
    paths = []
    by = ["scheduler", "source"] if "source" in df else ["scheduler"]
    kfile = folder / "knee.csv"
    knees = pd.read_csv(kfile) if kfile.exists() else pd.DataFrame()
    bt = df[pd.to_numeric(df.request_rate, errors="coerce").notna()]
    if pd.to_numeric(df.request_rate, errors="coerce").groupby([df[c] for c in by]).nunique().max() > 1:
        paths.append(training.util_vs_rate(df, out / "util_vs_rate.png"))  # the sweep changed the offered load
        for source, d in bt.groupby("source", sort=False) if "source" in bt else [("sim", bt)]:
            k = knees[knees.source == source] if len(knees) else knees
            paths.append(bubbletea.load_sweep(d, k, out / f"load_sweep_{source}.png"))  # with the knee
    rfile = folder / "requests.csv"
    if not rfile.exists():
        notes.append("TTFT CDF: no requests.csv")
        return paths
    reqs = pd.read_csv(rfile)
    if reqs.empty:
        notes.append("TTFT CDF: requests.csv has no requests")
        return paths
    slo = _spec_value(folder, ("bubbletea", "ttft_slo_ms"))
    paths.append(training.ttft_cdfs(reqs, df, keys, out / "ttft_cdf.png", slo))
    runs: list[str] = []  # bubble- vs pool-served: at the knee and the next offered rate above it
    for _, k in knees.iterrows():
        d = bt[(bt.scheduler == k.scheduler) & (bt.source == k.source)] if "source" in bt else bt
        for rate in (k.knee_request_rate, k.next_request_rate):
            if pd.notna(rate):
                runs += list(d[(pd.to_numeric(d.request_rate) - float(rate)).abs() < 1e-6].run_id)
    runs = list(dict.fromkeys(runs)) or list(bt.run_id[bt.run_id.astype(str).str.startswith("p00-")])
    for src, r in reqs[reqs.run_id.isin(runs)].groupby("source", sort=False):
        title = f"TTFT ({src}): bubbles vs pool" + (", at the knee and just past it" if len(knees) else "")
        paths.append(bubbletea.ttft_cdf(r, out / f"ttft_cdf_bubble_pool_{src}.png", slo, title))
    return paths


def _captured(folder: Path, out: Path, notes: list[str]) -> list[Path]:
    """flows.csv from a packet capture (`--capture`, `testbed launch`, `topology capture`): per-millisecond
    bytes, stacked per replica, with each link's emulated capacity when spec.yaml and summary.csv give it."""
    ffile = folder / "flows.csv"
    if not ffile.exists() or "t_ms" not in pd.read_csv(ffile, nrows=0).columns:
        return []
    from testbed.figures.launch import captured_flows, contention_window

    caps = _capacities_mbps(folder)
    if not caps:
        notes.append("capture figures: no link capacity line (needs spec.yaml and the emulation scale in "
                      "summary.csv)")
    paths = []
    flows = pd.read_csv(ffile)
    for run_id, d in flows.groupby("run_id", sort=False):
        paths.append(captured_flows(d, out / f"wan_flows_{run_id}.png", capacity_mbps=caps))
        win = contention_window(d)
        if win is not None:  # milliseconds are invisible over a whole run: a 200 ms zoom as well
            paths.append(captured_flows(d, out / f"wan_flows_{run_id}_zoom.png", window_ms=win, capacity_mbps=caps))
    return paths


def _capacities_mbps(folder: Path) -> dict[str, float]:
    """Emulated capacity per link `<a>-<b>` (Mbit/s): the spec's real-world rate divided by the run's scale."""
    import yaml

    spec, summ = folder / "spec.yaml", folder / "summary.csv"
    if not spec.exists() or not summ.exists():
        return {}
    topo = (yaml.safe_load(spec.read_text()) or {}).get("topology") or {}
    s = pd.read_csv(summ)
    emu = s[s.source == "emu"] if "source" in s else s
    if "scale" not in emu or emu.empty or not isinstance(topo, dict):
        return {}
    k = float(emu.scale.iloc[0])
    return {"-".join(lk["between"]): gbps_to_mbps(float(lk["gbps"])) / k for lk in topo.get("links", [])
            if isinstance(lk, dict) and "between" in lk and "gbps" in lk}


def _flows(folder: Path, out: Path, notes: list[str]) -> list[Path]:
    ffile = folder / "flows.csv"
    if not ffile.exists() or "t_ms" in pd.read_csv(ffile, nrows=0).columns:  # captures: _captured
        return []
    flows = pd.read_csv(ffile)
    if "link_gbps" not in flows:
        notes.append("flow figures: flows.csv has no link_gbps column (written before it was added), so no capacity "
                     "line")
    tl = pd.read_csv(folder / "timeline.csv") if (folder / "timeline.csv").exists() else None
    paths = []
    for run_id in flows.run_id.unique():
        n, gap = training.flow_sampling(flows, run_id)
        if n < training.FLOW_MIN_SAMPLES:
            notes.append(f"wan_flows_{run_id}.png skipped: only {n} samples per replica and direction in the sampled "
                         f"iteration (one every {s_to_ms(gap):.0f} ms; the sampler aims at 20 ms), too few to show who "
                         f"has the link; lines between them would invent a shape. A busy machine slows `tc -s`: "
                         f"rerun on a quieter one")
            continue
        it = int(flows[flows.run_id == run_id].iteration.iloc[0])
        t0 = None
        if tl is not None:  # the same time axis as the Gantt chart of that iteration
            d = tl[(tl.run_id == run_id) & (tl.source == "emu") & (tl.iteration == it)]
            t0 = float(d.start_s.min()) if len(d) else None
        paths.append(training.wan_flows(flows, run_id, out / f"wan_flows_{run_id}.png", t0))
    return paths


def _gantts(folder: Path, df: pd.DataFrame, keys: list[str], out: Path, notes: list[str]) -> list[Path]:
    tfile = folder / "timeline.csv"
    if not tfile.exists():
        notes.append("Gantt charts: no timeline.csv (experiment `timeline: none`)")
        return []
    tl = pd.read_csv(tfile)
    runs = list(dict.fromkeys(tl.run_id))
    first = [r for r in runs if str(r).startswith("p00-")]
    pick = runs if len(runs) <= MAX_GANTT_RUNS else first or runs[:MAX_GANTT_RUNS]
    npoints = df.sweep.nunique() if "sweep" in df else 1
    kept = tl.run_id.str.split("-").str[0].nunique()
    if npoints > 1 and kept < npoints:
        notes.append(f"Gantt charts: timeline.csv holds {kept} of {npoints} sweep points (`timeline: first-point`); "
                     f"set `timeline: all` for every point")
    elif len(pick) < len(runs):
        notes.append(f"Gantt charts: drawn for the first sweep point only ({len(pick)} of {len(runs)} runs)")
    ndcs = dict(zip(df.run_id, df.dcs.astype(str).str.count(r"\|") + 1, strict=False)) if "dcs" in df else {}
    r0 = tl[tl.replica == 0].groupby("run_id").dc.nunique()
    paths = [gantt.gantt(tl, r, out / f"gantt_{r}.png", allreduce_over_wan=ndcs.get(r, 1) > r0.get(r, 1))
             for r in pick]
    for r in tl[tl.kind == "prefill"].run_id.unique():  # one iteration with prefill, simulated and emulated
        if r in pick:
            paths.append(bubbletea.gantt_pair(tl, r, out / f"gantt_prefill_{r}.png"))
    return paths


def _spec_value(folder: Path, path: tuple[str, ...]) -> float | None:
    """A value from the spec the run recorded (spec.yaml), if it did."""
    import yaml

    f = folder / "spec.yaml"
    if not f.exists():
        return None
    node = yaml.safe_load(f.read_text())
    for p in path:
        if not isinstance(node, dict) or p not in node:
            return None
        node = node[p]
    return float(node) if isinstance(node, (int, float)) else None

"""Draw every figure a results folder's CSVs support."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.figures import training


def draw_all(folder: Path, out: Path) -> list[Path]:
    folder, out = Path(folder), Path(out)
    paths: list[Path] = []
    if (folder / "backends.csv").exists():  # bench/backend_compare.py: one run per backend in subfolders
        paths.append(training.backends(pd.read_csv(folder / "backends.csv"), out / "backends.png"))
        for sub in sorted(p for p in folder.iterdir() if (p / "summary.csv").exists()):
            paths += draw_all(sub, out / sub.name)
    ffile = folder / "flows.csv"
    captured = ffile.exists() and "t_ms" in pd.read_csv(ffile, nrows=0).columns  # a packet capture's flows
    if captured:
        from testbed.figures.launch import captured_flows, contention_window

        flows = pd.read_csv(ffile)
        for run_id, d in flows.groupby("run_id", sort=False):
            paths.append(captured_flows(d, out / f"wan_flows_{run_id}.png"))
            win = contention_window(d)
            if win is not None:  # milliseconds are invisible over a whole run: a 200 ms zoom as well
                paths.append(captured_flows(d, out / f"wan_flows_{run_id}_zoom.png", window_ms=win))
    sfile = folder / "summary.csv"
    if not sfile.exists():
        return paths
    summary = pd.read_csv(sfile)
    if (folder / "loss.csv").exists():
        paths.append(training.loss_curve(pd.read_csv(folder / "loss.csv"), out / "loss.png"))
    if "throughput_mbps" in summary:  # a multi-TCP experiment
        return [training.multitcp(summary, out / "multitcp.png")]
    sim = summary[summary.source == "sim"] if "source" in summary else summary
    if sim.empty:
        return paths
    if sim.wan_latency_ms.nunique() > 1:
        paths.append(training.iteration_vs_latency(sim, out / "iteration_vs_latency.png"))
        paths.append(training.speedup(sim, out / "speedup_vs_latency.png"))
    ndcs = sim.dcs.str.count(r"\|") + 1
    if ndcs.nunique() > 1:
        paths.append(training.speedup(sim.assign(ndcs=ndcs), out / "speedup_vs_dcs.png", "ndcs", "number of DCs"))
    paths.append(training.gpu_utilization(sim, out / "gpu_util.png"))
    if "request_rate" in sim and sim.request_rate.notna().any():
        if sim.request_rate.nunique() > 1:
            paths.append(training.util_vs_rate(sim, out / "util_vs_rate.png"))
        rfile = folder / "requests.csv"
        if rfile.exists():
            reqs = pd.read_csv(rfile)
            first = reqs[reqs.run_id.str.startswith("p00-")] if reqs.run_id.str.startswith("p00-").any() else reqs
            paths.append(training.ttft_cdf(first, out / "ttft_cdf.png"))
    if "emu" in set(summary.source):
        paths.append(training.sim_vs_emu(summary, out / "sim_vs_emu.png"))
    if ffile.exists() and not captured:
        flows = pd.read_csv(ffile)
        for run_id in flows.run_id.unique():
            paths.append(training.wan_flows(flows, run_id, out / f"wan_flows_{run_id}.png"))
    tfile = folder / "timeline.csv"
    if tfile.exists():
        tl = pd.read_csv(tfile)
        for (run_id, source), d in tl.groupby(["run_id", "source"], sort=False):
            if run_id.startswith("p00-") or tl.run_id.nunique() <= 6:
                name = f"gantt_{run_id}.png" if source == "sim" else f"gantt_{run_id}_{source}.png"
                paths.append(training.gantt(d, run_id, out / name, title_suffix=f" [{source}]"))
    return paths

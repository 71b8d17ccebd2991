"""The emulated runs' timing health: each run's timing error (what the machine's timing can cost its iteration
time, testbed/emu/health.py) against its budget, beside the simulator-vs-emulator error where it was measured."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.figures.style import new, save


def timing_health(summary: pd.DataFrame, validation: pd.DataFrame | None, path: Path) -> Path:
    """One bar per emulated run: its timing error, red where the run was marked degraded; the dashed line is the
    budget; a black dot is |simulated - emulated| / emulated iteration time (validation.csv), where there is one."""
    emu = summary[summary.source == "emu"].reset_index(drop=True)
    names = [str(r) for r in emu.run_id]
    errs = emu.timing_error.fillna(0.0).astype(float) * 100
    bad = emu.degraded.fillna("").astype(str) != "" if "degraded" in emu else pd.Series(False, index=emu.index)
    fig, ax = new((max(4.5, 0.9 * len(names) + 2), 3.6))
    ax.bar(range(len(names)), errs, color=["#c0392b" if b else "#4a7fb0" for b in bad], width=0.6,
           label="timing error (bound)")
    budget = emu.timing_budget.dropna().astype(float) * 100 if "timing_budget" in emu else pd.Series(dtype=float)
    if not budget.empty:
        ax.axhline(budget.max(), color="k", ls="--", lw=0.9, label=f"budget {budget.max():g} %")
    if validation is not None and not validation.empty:
        v = validation[validation.metric == "iteration_s"].set_index("run_id").rel_error.astype(float).abs() * 100
        pts = [(i, v[n]) for i, n in enumerate(names) if n in v.index]
        if pts:
            ax.scatter(*zip(*pts, strict=True), color="k", zorder=3, s=18, label="|sim - emu| / emu (measured)")
    ax.set_xticks(range(len(names)), names, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("share of the iteration time (%)")
    ax.set_title("Emulated runs' timing health (red: degraded)", fontsize=10)
    ax.legend(fontsize=7)
    save(fig, path)
    return path

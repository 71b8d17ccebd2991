"""Figures that follow the sweep: the swept key on x, one line per scheduler, one panel per value of
any other swept key, every scheduler visible.

Schedulers that coincide (pp-wan+temporal on top of pp-wan when the link is not shared) are told
apart by hollow markers of decreasing size and a note in the panel naming the pairs that overlap.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, NullFormatter

from testbed import columns as reg
from testbed.analysis.sweep import is_numeric
from testbed.figures.style import colour, plt, save

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
OVERLAP_RTOL = 0.01  # series within 1 % at every point are called out as overlapping


def style(i: int, sched: str, source: str = "sim") -> dict:
    """Line style of the i-th series: its scheduler's colour, its own marker, hollow markers shrinking with
    i (so a later series drawn on an earlier one leaves the earlier one's ring visible)."""
    return {"color": colour(sched), "marker": MARKERS[i % len(MARKERS)], "markersize": max(4.0, 11 - 1.6 * i),
            "markerfacecolor": "none", "markeredgewidth": 1.6, "linewidth": max(1.0, 2.6 - 0.3 * i),
            "linestyle": "-" if source == "sim" else "--", "zorder": 3 + i}


def point_label(key: str, value: object) -> str:
    """`WAN capacity (every link) = 400 Gbit/s`."""
    u = reg.unit(key)
    v = f"{value:g}" if isinstance(value, float) else str(value)
    return f"{reg.words(key)} = {v}{' ' + u if u and u != 'share' else ''}"


def log_scale(values: list[float]) -> bool:
    """Log axis for values the user spaced geometrically (100, 400, 1600; 1, 2, 4, 8), linear otherwise."""
    v = sorted(set(values))
    if len(v) < 2 or v[0] <= 0 or v[-1] / v[0] < 8:
        return False
    return min(b / a for a, b in zip(v, v[1:], strict=False)) >= 1.9


def coincide(xs: np.ndarray, ys: np.ndarray, ox: np.ndarray, oy: np.ndarray) -> bool:
    """Two series a reader could not tell apart: the same x values and y within 1 % at every one."""
    return len(xs) == len(ox) and bool(np.allclose(xs, ox)) and bool(np.allclose(ys, oy, rtol=OVERLAP_RTOL, atol=0))


def panels(df: pd.DataFrame, facets: list[str]) -> list[tuple[tuple, pd.DataFrame]]:
    """(facet values, rows) per combination that has rows, in sweep order."""
    if not facets:
        return [((), df)]
    values = [list(dict.fromkeys(df[f])) for f in facets]
    out = []
    for combo in itertools.product(*values):
        mask = np.ones(len(df), bool)
        for f, v in zip(facets, combo, strict=True):
            mask &= (df[f] == v).to_numpy()
        if mask.any():
            out.append((combo, df[mask]))
    return out


def series(df: pd.DataFrame) -> list[tuple[str, str]]:
    srcs = list(dict.fromkeys(df.source)) if "source" in df.columns else ["sim"]
    return [(s, src) for s in dict.fromkeys(df.scheduler) for src in srcs
            if ((df.scheduler == s) & (df.source == src) if "source" in df.columns else df.scheduler == s).any()]


def _name(sched: str, source: str, sources: int) -> str:
    return sched if sources == 1 else f"{sched} ({'simulated' if source == 'sim' else 'emulated'})"


def line_figure(df: pd.DataFrame, metric: str, x: str, facets: list[str], path: Path, title: str,
                values: pd.Series | None = None, ref: float | None = None) -> Path:
    """`metric` (or `values`, aligned with df) against the swept key `x`; one panel per facet combination."""
    df = df.assign(_y=values if values is not None else pd.to_numeric(df[metric], errors="coerce"))
    df = df[df._y.notna()]
    groups = panels(df, facets)
    n = len(groups)
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.9 * ncols + 2.4, 3.3 * nrows + 0.9), dpi=120, sharex=True,
                             sharey=True, squeeze=False, layout="constrained")
    numeric = is_numeric(df[x])
    cats = list(dict.fromkeys(df[x]))
    pos = (lambda v: v) if numeric else (lambda v: cats.index(v))
    all_series = series(df)
    nsrc = len({s for _, s in all_series})
    handles: dict[str, object] = {}
    for ax, (combo, d) in zip(axes.flat, groups, strict=False):
        drawn: list[tuple[str, np.ndarray, np.ndarray]] = []
        overlaps: list[str] = []
        for i, (sched, src) in enumerate(all_series):
            g = d[(d.scheduler == sched) & ((d.source == src) if "source" in d.columns else True)]
            if g.empty:
                continue
            g = g.assign(_x=[pos(v) for v in g[x]]).sort_values("_x")
            xs, ys = g._x.to_numpy(float), g._y.to_numpy(float)
            name = _name(sched, src, nsrc)
            (h,) = ax.plot(xs, ys, label=name, **style(i, sched, src))
            handles.setdefault(name, h)
            other = next((o for o, ox, oy in drawn if coincide(xs, ys, ox, oy)), None)
            if other is not None:
                overlaps.append(f"{name} = {other}")
            drawn.append((name, xs, ys))
        if metric == "iteration_s" and "lower_bound_s" in d.columns:
            lb = d.groupby(x).lower_bound_s.min()
            (h,) = ax.plot([pos(v) for v in lb.index], lb.to_numpy(float), "k:", lw=1.2, zorder=1,
                           label="lower bound (ideal WAN)")
            handles.setdefault("lower bound (ideal WAN)", h)
        if ref is not None:
            ax.axhline(ref, color="k", lw=0.8, zorder=1)
        head = ", ".join(point_label(f, v) for f, v in zip(facets, combo, strict=True))
        if overlaps:  # said above the panel, where it hides no data
            head = "\n".join(x for x in (head, f"on top of each other (within 1 %): {'; '.join(overlaps)}") if x)
        if head:
            ax.set_title(head, fontsize=8)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    _scale_axes(axes, df, x, metric, numeric, cats)
    for ax in axes[-1, :]:
        ax.set_xlabel(reg.label(x), fontsize=9)
    for ax in axes[:, 0]:
        ax.set_ylabel(reg.label(metric), fontsize=9)
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center", fontsize=8,
               ncol=min(len(handles), 5))
    fig.suptitle(title, fontsize=10)
    save(fig, path, tight=False)
    return path


def _scale_axes(axes, df: pd.DataFrame, x: str, metric: str, numeric: bool, cats: list) -> None:
    ax0 = axes.flat[0]
    if numeric:
        xs = sorted({float(v) for v in df[x]})
        if log_scale(xs):
            ax0.set_xscale("log")
        ax0.set_xticks(xs, [f"{v:g}" for v in xs])
        ax0.xaxis.set_minor_formatter(NullFormatter())
    else:
        ax0.set_xticks(range(len(cats)), [str(c) for c in cats], rotation=15)
    y = df._y.to_numpy(float)
    u = reg.unit(metric)
    if u == "share":
        if (y >= 0).all() and (y <= 1.0001).all():
            ax0.set_ylim(0, 1.04)
        ax0.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:.0%}"))
    elif (y > 0).all() and y.max() / y.min() >= 10:
        ax0.set_yscale("log")
        ax0.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: tick(v)))
        few = y.max() / y.min() < 100  # label 2 and 5 between the decades only when there are few decades
        ax0.yaxis.set_minor_formatter(FuncFormatter(lambda v, _p: tick(v) if few and leading(v) in (2, 5) else ""))
    elif (y >= 0).all():
        ax0.set_ylim(bottom=0, top=y.max() * 1.08 if y.max() > 0 else 1)


def leading(v: float) -> int:
    """The leading digit of a positive number (0.2 -> 2, 50 -> 5)."""
    return round(v / 10 ** math.floor(math.log10(v))) if v > 0 else 0


def tick(v: float) -> str:
    """Plain tick text: 0.01, 5, 2,000, 1,000,000 (never 1e+06)."""
    return f"{v:,.0f}" if v >= 1000 else f"{v:g}"


def speedup_values(df: pd.DataFrame, keys: list[str], over: str = "atlas") -> pd.Series | None:
    """Each scheduler's iteration time divided by `over`'s at the same sweep point and source (so Atlas's
    speedup over X is X's value); None when `over` or another scheduler is missing."""
    if over not in set(df.scheduler) or df.scheduler.nunique() < 2:
        return None
    by = [*keys, "source"] if "source" in df.columns else list(keys)
    ref = df[df.scheduler == over].set_index(by).iteration_s if by else df[df.scheduler == over].iteration_s
    if by:
        idx = pd.MultiIndex.from_frame(df[by]) if len(by) > 1 else pd.Index(df[by[0]])
        return pd.Series(df.iteration_s.to_numpy(float) / ref.reindex(idx).to_numpy(float), index=df.index)
    return df.iteration_s / float(ref.iloc[0])

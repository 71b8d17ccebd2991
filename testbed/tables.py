"""Tables that answer the question a run asked: the swept keys as columns, the metrics that matter
for the schedulers run (serving metrics for `+bubbletea`), constants in a caption, and a layout that
fits the terminal by splitting columns into blocks (key columns repeated), never by cutting headers.

One view feeds both the console (rich) and report.html; columns other code adds later appear at the
end, and missing ones are simply left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path

import pandas as pd

from testbed import columns as reg
from testbed.analysis.sweep import short_names, varying, with_sweep_columns

# summary.csv: what describes the configuration (constant ones go to the caption) ...
CONFIG = ("model", "dcs", "gpus", "tp", "pp", "dp", "microbatches", "wan_latency_ms", "wan_gbps", "tcp_connections",
          "scale")
# ... the metrics every training run gets, in this order ...
METRICS = ("iteration_s", "speedup_vs_best", "best_baseline", "tokens_per_s_per_gpu", "gpu_util", "bubble_frac",
           "lower_bound_s", "status", "degraded")
# ... and the serving metrics, shown when a `+bubbletea` scheduler is in the table.
SERVING = ("prefill_util", "served_in_bubbles", "ttft_p50_ms", "ttft_p99_ms", "slo_attainment", "train_slowdown",
           "request_rate")
HIDDEN = ("run_id", "sweep", "train_util", "tokens_per_s", "wan_min_s", "prefill_tokens_per_s", "requests",
          "fallback")  # in the CSV; shown with --columns
SIGNED = ("rel_error", "train_slowdown")


@dataclass
class View:
    """A table ready to print: headers, cell text, how many leading key columns, a caption."""
    title: str
    names: list[str]  # CSV column names (or sweep keys)
    headers: list[str]
    rows: list[list[str]]
    keys: int = 0
    caption: str = ""
    meanings: list[str] = field(default_factory=list)


def fmt_value(name: str, v: object) -> str:
    """Cell text: shares as %, large numbers with thousands separators, 4 significant digits otherwise."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return str(v)
    u = reg.unit(name)
    x = float(v)  # type: ignore[arg-type]
    if u == "share" and name not in ("speedup_vs_best",):
        if 0 < abs(x) < 0.001:
            return f"{x * 100:{'+' if name in SIGNED else ''}.2g}%"
        return f"{x * 100:+.1f}%" if name in SIGNED else f"{x * 100:.1f}%"
    if x.is_integer() and abs(x) < 1e15 and (isinstance(v, Integral) or u in ("", "GPUs", "bytes", "tokens")):
        return f"{int(x):,}" if abs(x) >= 10_000 else str(int(x))
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) < 1e-3:
        return f"{x:.3g}"  # 0.000153, 4.7e-05
    return f"{x:#.4g}".rstrip(".")  # 4 significant digits, trailing zeros kept (44.00, 8.530)


def _present(df: pd.DataFrame, c: str) -> bool:
    return c in df.columns and df[c].replace("", float("nan")).notna().any()


def _constant(df: pd.DataFrame, c: str) -> bool:
    return df[c].replace("", float("nan")).nunique(dropna=True) <= 1


def summary_columns(df: pd.DataFrame, keys: list[str]) -> tuple[list[str], int, list[str]]:
    """(columns in order, how many are key columns, constant columns for the caption)."""
    point = df["sweep"] if "sweep" in df.columns else pd.Series("", index=df.index)
    var_keys = varying(df, keys)
    ids = [*var_keys, "scheduler"] if "scheduler" in df.columns else list(var_keys)
    if "source" in df.columns and df.source.nunique() > 1:
        ids.append("source")
    caption = [k for k in keys if k not in var_keys]
    cols: list[str] = []
    for c in CONFIG:
        if c not in df.columns or not _present(df, c):
            continue
        if _constant(df, c):
            caption.append(c)
        elif df.groupby(point)[c].nunique().max() > 1:  # varies within a point: not implied by the sweep
            cols.append(c)
    cols += [c for c in METRICS if _present(df, c)]
    if len(df) > 1:  # the same everywhere: said once, in the caption
        caption += [c for c in cols if _constant(df, c)]
        cols = [c for c in cols if c not in caption]
    if "scheduler" in df.columns and df.scheduler.astype(str).str.contains(r"\+bubbletea").any():
        cols += [c for c in SERVING if _present(df, c)]
    known = {*CONFIG, *METRICS, *SERVING, *HIDDEN, *ids, *keys, "source"}
    extra = [c for c in df.columns if c not in known and _present(df, c)]  # columns added since
    if "source" in df.columns and "source" not in ids:
        caption.append("source")
    cols += [c for c in extra if not (len(df) > 1 and _constant(df, c))]
    caption += [c for c in extra if len(df) > 1 and _constant(df, c)]
    return ids + cols, len(ids), caption


# What names a row of the other CSVs (repeated in every block when a table is split)
ROW_KEYS = (("scheduler", "metric"), ("order",), ("link",), ("run_id",))
REDUNDANT = {("scheduler", "metric"): ("run_id",)}  # run_id is p00-<scheduler> there


def generic_columns(df: pd.DataFrame) -> tuple[list[str], int, list[str]]:
    """Any other CSV: its row keys first, then every column with a value; constant ones in the caption."""
    keys = next((list(k) for k in ROW_KEYS if all(c in df.columns for c in k)), [])
    drop = set(REDUNDANT.get(tuple(keys), ())) if df.get("run_id", pd.Series(dtype=str)).nunique() <= 1 or \
        "scheduler" in keys else set()
    cols = [c for c in df.columns if _present(df, c) and c not in keys and c not in drop]
    caption = [c for c in cols if len(df) > 1 and _constant(df, c)]
    return keys + [c for c in cols if c not in caption], len(keys), caption


def multitcp_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A multi-TCP summary with each run's measured and modelled throughput side by side."""
    ids = [c for c in ("run_id", "link", "wan_latency_ms", "tcp_connections", "window_kib", "wan_mbps", "scale",
                       "delay_method", "sweep") if c in df.columns]
    wide = df.pivot_table(index="run_id", columns="source", values="throughput_mbps", aggfunc="first")
    wide.columns = [f"{c}_mbps" for c in wide.columns]
    base = df.drop_duplicates("run_id")[ids].set_index("run_id")
    return base.join(wide).reset_index()


def view(df: pd.DataFrame, title: str, columns: list[str] | None = None, summary: bool = True) -> View:
    """The table of a summary.csv (sweep-aware) or any other results CSV; `columns` picks them by name
    (`all` for every column), in the given order."""
    multitcp = summary and "throughput_mbps" in df.columns and "source" in df.columns and columns is None
    if multitcp:
        df = multitcp_frame(df)
    df, keys = with_sweep_columns(df) if summary else (df, [])
    short = short_names(keys)
    if columns and columns != ["all"]:
        missing = [c for c in columns if c not in df.columns and c not in short.values()]
        if missing:
            from testbed.errors import SpecError

            raise SpecError("--columns", f"no column {', '.join(missing)} in this table",
                            f"use some of {', '.join([*short.values(), *df.columns])}")
        by_short = {v: k for k, v in short.items()}
        cols, nkeys, caption = [by_short.get(c, c) for c in columns], 0, []
    elif columns == ["all"]:
        cols, nkeys, caption = [c for c in df.columns if c not in keys], 0, []
    elif summary and "scheduler" in df.columns:
        cols, nkeys, caption = summary_columns(df, keys)
    elif multitcp:
        ids = [*varying(df, keys), "link", "tcp_connections"]
        rest = [c for c in ("wan_latency_ms", "window_kib", "wan_mbps", "scale", "delay_method") if c in df.columns]
        caption = [k for k in keys if k not in ids] + [c for c in rest if _constant(df, c)]
        point = df["sweep"].fillna("") if "sweep" in df.columns else pd.Series("", index=df.index)
        extra = [c for c in rest if c not in caption and df.groupby(point)[c].nunique().max() > 1]
        cols, nkeys = [*ids, *extra, *[c for c in df.columns if c.endswith("_mbps") and c != "wan_mbps"]], len(ids)
    else:
        cols, nkeys, caption = generic_columns(df)

    def cell(c: str, v: object) -> str:  # a swept value as the user wrote it (5, not 5.000)
        return f"{v:g}" if c in keys and isinstance(v, float) else fmt_value(c, v)

    rows = [[cell(c, r[c]) for c in cols] for _, r in df.iterrows()]
    first = df.iloc[0] if len(df) else {}
    cap = ", ".join(f"{short.get(c, c)} {cell(c, first[c])}" for c in caption)  # type: ignore[index]
    meanings = [(reg.column(c).meaning if reg.column(c) else reg.label(c)) for c in cols]  # type: ignore[union-attr]
    return View(title, cols, [short.get(c, c) for c in cols], rows, nkeys, cap, meanings)


PLAN_SHOWN = ("sweep", "family", "dcs", "order", "tp", "pp", "dp", "microbatch", "stages", "replicas", "iteration_s",
              "tokens_per_s", "token_efficiency", "effective_tokens_per_s", "status")


def read_view(path: Path, columns: list[str] | None = None, title: str | None = None) -> View:
    df = pd.read_csv(path, keep_default_na=True)
    if path.name == "plan.csv" and columns is None and "status" in df:  # a screen, not every layout searched
        best = df[df["status"].astype(str).str.startswith("best")]
        title = f"{title or path}: the best of every family and DC set ({len(best):,} of {len(df):,} layouts)"
        df, columns = best, [c for c in PLAN_SHOWN if c in df]
    return view(df, title or str(path), columns, summary=path.name == "summary.csv")


# --- layout --------------------------------------------------------------------------------------
def col_width(v: View, i: int) -> int:
    return max([len(v.headers[i]), *(len(r[i]) for r in v.rows)])


def table_width(widths: list[int]) -> int:
    """Width rich's default table takes: each column plus 2 of padding, plus a border between and around."""
    return sum(w + 2 for w in widths) + len(widths) + 1


def blocks(v: View, width: int) -> list[list[int]]:
    """Column indices per printed block: every block repeats the key columns and fits `width` (a column too
    wide even alone still gets a block of its own)."""
    keys = list(range(v.keys))
    w = [col_width(v, i) for i in range(len(v.names))]
    out: list[list[int]] = []
    cur = list(keys)
    for i in range(v.keys, len(v.names)):
        if len(cur) > len(keys) and table_width([w[j] for j in [*cur, i]]) > width:
            out.append(cur)
            cur = [*keys]
        cur.append(i)
    if len(cur) > len(keys) or not out:
        out.append(cur)
    return out


def rich_tables(v: View, width: int) -> list:
    """rich renderables for the console: Tables split into blocks that fit `width`, then the caption."""
    from rich.table import Table
    from rich.text import Text

    out: list = []
    bl = blocks(v, width)
    for n, idx in enumerate(bl):
        title = v.title if n == 0 else f"{v.title} (continued)"
        t = Table(title=title)
        for i in idx:
            left = not all(_numeric_text(r[i]) or not r[i] for r in v.rows)
            t.add_column(v.headers[i], justify="left" if left else "right", no_wrap=True,
                         min_width=len(v.headers[i]))
        for r in v.rows:
            t.add_row(*[Text(r[i]) for i in idx])  # cells are data (names, reasons), never rich markup
        out.append(t)
    if v.caption:
        out.append(Text(f"same in every row: {v.caption}", style="dim"))
    return out


def _numeric_text(s: str) -> bool:
    try:
        float(s.replace(",", "").rstrip("%"))
    except ValueError:
        return False
    return True


def html_table(v: View, table_id: str = "") -> str:
    """The same view as an HTML table (every column; the page scrolls sideways), meanings as tooltips."""
    from html import escape

    ident = f' id="{escape(table_id)}"' if table_id else ""
    left = [not all(_numeric_text(r[i]) or not r[i] for r in v.rows) for i in range(len(v.names))]
    al = [' style="text-align:left"' if x else "" for x in left]
    head = "".join(f'<th title="{escape(m)}"{a}>{escape(h)}</th>'
                   for h, m, a in zip(v.headers, v.meanings, al, strict=True))
    body = "".join("<tr>" + "".join(f"<td{a}>{escape(c)}</td>" for c, a in zip(r, al, strict=True)) + "</tr>"
                   for r in v.rows)
    cap = f"<caption>{escape(v.caption)}</caption>" if v.caption else ""
    return f"<table{ident}>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

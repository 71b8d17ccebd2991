"""A results table's sweep: which keys were swept, each row's value of each, and which to plot on x.

summary.csv records each row's sweep point as `key=value;key=value` (the `sweep` column). Tables
and figures show those keys as columns and axes, so the swept quantity is what the reader sees.
"""

from __future__ import annotations

import pandas as pd


def parse_point(text: object) -> dict[str, object]:
    """`a.b=5;c=x` -> {'a.b': 5.0, 'c': 'x'} (numbers become floats; anything else stays text)."""
    if not isinstance(text, str) or not text:
        return {}
    out: dict[str, object] = {}
    for part in text.split(";"):
        if "=" not in part:
            continue
        k, v = part.split("=", 1)
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = v
    return out


def with_sweep_columns(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The frame with one column per swept key (named by the key) and the keys in sweep order."""
    if "sweep" not in df.columns:
        return df, []
    points = [parse_point(s) for s in df["sweep"]]
    keys = list(dict.fromkeys(k for p in points for k in p))
    keys = [k for k in keys if k not in df.columns]  # never shadow a real column
    if not keys:
        return df, []
    extra = pd.DataFrame({k: [p.get(k) for p in points] for k in keys}, index=df.index)
    return pd.concat([df, extra], axis=1), keys


def varying(df: pd.DataFrame, keys: list[str]) -> list[str]:
    return [k for k in keys if df[k].nunique(dropna=True) > 1]


def short_names(keys: list[str]) -> dict[str, str]:
    """The shortest dotted suffix that tells each key apart: `topology.links.*.latency_ms` -> `latency_ms`,
    but `links.0.gbps` and `links.1.gbps` -> `0.gbps`, `1.gbps`."""
    out = {}
    for k in keys:
        parts = k.split(".")
        for n in range(1, len(parts) + 1):
            cand = ".".join(parts[-n:])
            if all(o == k or not (o == cand or o.endswith("." + cand)) for o in keys):
                out[k] = cand.replace("*.", "") if cand.startswith("*.") else cand
                break
        else:
            out[k] = k
    return out


def is_numeric(values: pd.Series) -> bool:
    return all(isinstance(v, (int, float)) for v in values.dropna())


def axes(df: pd.DataFrame, keys: list[str]) -> tuple[str | None, list[str]]:
    """The key for the x-axis (numeric keys first, then the one with most values, then sweep order) and the
    other varying keys (one panel per combination of their values)."""
    var = varying(df, keys)
    if not var:
        return None, []
    x = max(var, key=lambda k: (is_numeric(df[k]), df[k].nunique(), -var.index(k)))
    return x, [k for k in var if k != x]

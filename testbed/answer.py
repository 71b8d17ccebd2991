"""`testbed plan`'s one-page answer: answer.html (self-contained: the figure embedded, the tables inline) beside
plan.csv, from plan.csv only. Per sweep point: the best plan of every family over several DCs, the best one-site
plan, and which is best; then how the best moves over each swept setting."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from testbed.figures.answer import FAMILY_ORDER, bests, draw
from testbed.results import atomic_open

COLUMNS = (("family", "family"), ("dcs", "DCs"), ("order", "order"), ("tp", "tp"), ("pp", "pp"), ("dp", "dp"),
           ("microbatch", "mb"), ("iteration_s", "iteration (s)"), ("tokens_per_s", "tokens/s"),
           ("token_efficiency", "token efficiency"), ("effective_tokens_per_s", "effective tokens/s"))


def _cell(v: object) -> str:
    if isinstance(v, float):
        if v != v:
            return ""
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:,.1f}"
    return html.escape(str(v).replace("|", " + "))


def _table(rows: pd.DataFrame, best_key: object) -> str:
    head = "".join(f"<th>{h}</th>" for _, h in COLUMNS)
    body = []
    for key, r in rows.iterrows():
        style = ' style="font-weight:bold"' if key == best_key else ""
        body.append(f"<tr{style}>" + "".join(f"<td>{_cell(r[c])}</td>" for c, _ in COLUMNS) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def write_answer(csv_path: Path, folder: Path, note: str) -> Path:
    """answer.png and answer.html in `folder` from the planner's plan.csv; returns the HTML's path."""
    plan = pd.read_csv(csv_path)
    png = draw(plan, folder / "answer.png")
    b = bests(plan)
    rank = {f: i for i, f in enumerate((*FAMILY_ORDER, "one site"))}
    parts = [f"<h1>Which family, which DCs?</h1><p>{html.escape(note)}. Effective tokens/s = tokens/s x the "
             "family's token efficiency (testbed/plan/efficiency.py): the throughput in synchronous-training tokens."
             "</p>", f'<img src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}" '
             'alt="best effective tokens/s per family">']
    every = plan[plan["status"].astype(str).str.startswith("best")].copy()
    every["sweep"] = every["sweep"].fillna("") if "sweep" in every else ""
    for point, g in b.groupby("sweep", sort=False):
        g = g.sort_values("family", key=lambda s: s.map(rank))
        top = g["effective_tokens_per_s"].idxmax()
        w = g.loc[top]
        title = html.escape(point.replace(";", ", ")) if point else "The answer"
        sets = every[every["sweep"] == point]
        parts.append(f"<h2>{title}</h2><p>Best: <b>{html.escape(w['family'])}</b> on "
                     f"{html.escape(w['dcs'].replace('|', ' + '))}, {w['effective_tokens_per_s']:,.0f} effective "
                     f"tokens/s ({w['iteration_s']:.3f} s per iteration).</p>" + _table(g, top)
                     + f"<details><summary>every family and DC set ({len(sets)})</summary>"
                     + _table(sets, None) + "</details>")
    if b["sweep"].nunique() > 1:
        parts.append("<h2>Sensitivity</h2>" + _sensitivity(b))
    style = ("body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}")
    path = folder / "answer.html"
    with atomic_open(path, "w") as f:
        f.write(f"<!doctype html><html><head><meta charset='utf-8'><title>testbed plan: the answer</title>"
                f"<style>{style}</style></head><body>{''.join(parts)}</body></html>")
    return path


def _sensitivity(b: pd.DataFrame) -> str:
    """The best effective tokens/s of each family at every sweep point, one column per point."""
    points = list(dict.fromkeys(b["sweep"]))
    rows = []
    for fam, g in b.groupby("family", sort=False):
        by = g.set_index("sweep")["effective_tokens_per_s"]
        rows.append(f"<tr><td>{html.escape(fam)}</td>" + "".join(
            f"<td>{_cell(float(by[p])) if p in by else ''}</td>" for p in points) + "</tr>")
    best = b.groupby("sweep", sort=False)["effective_tokens_per_s"].max()
    rows.append("<tr style='font-weight:bold'><td>best</td>" + "".join(f"<td>{_cell(float(best[p]))}</td>"
                                                                        for p in points) + "</tr>")
    head = "<tr><th>family</th>" + "".join(f"<th>{html.escape(p.replace(';', ', '))}</th>" for p in points) + "</tr>"
    return f"<table>{head}{''.join(rows)}</table>"

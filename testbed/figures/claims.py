"""The claims figure: each published number beside ours, with the range we accept, one panel a claim."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from testbed.figures.style import save

VERDICT_COLOURS = {"reproduced": "#55A868", "not reproduced": "#C44E52", "different regime": "#CCB974"}
UNITS = {"x": "x", "fraction": "", "relative": "gain"}


def claims_figure(rows: list[dict], path: Path) -> Path:
    n = len(rows)
    fig, axes = plt.subplots(n, 1, figsize=(7.5, 1.25 * n + 0.6), dpi=120, squeeze=False)
    for ax, r in zip(axes[:, 0], rows, strict=True):
        pub = float(r["published"])
        ours = float(r["ours"]) if r["ours"] not in ("", None) else None
        lo, hi = (float(x) for x in str(r["accept"]).split("-", 1))
        top = max(pub, lo, ours or 0.0) * 1.45
        open_ended = hi >= top  # an "up to" claim: anything from lo up
        ax.axvspan(lo, min(hi, top), color="#dddddd")
        ax.text(lo, 1.45, f" accepted: {lo:g}{' and above' if open_ended else f' to {hi:g}'}", fontsize=6,
                va="center", color="#666666")
        ax.barh([1], [pub], color="#8c8c8c", height=0.6)
        ax.text(pub, 1, f" published {pub:g}", va="center", fontsize=7)
        if ours is not None:
            ax.barh([0], [ours], color=VERDICT_COLOURS.get(r["verdict"], "#64B5CD"), height=0.6)
            ax.text(ours, 0, f" ours {ours:.3g} ({r['verdict']})", va="center", fontsize=7)
        else:
            ax.text(0, 0, " no point met the card's conditions", va="center", fontsize=7)
        ax.set_yticks([])
        ax.set_ylim(-0.5, 1.75)
        ax.set_xlim(0, top)
        ax.set_title(f"{r['claim']}: {UNITS.get(r['unit'], '')} (baseline {r['baseline'] or 'n/a'})", fontsize=8,
                     loc="left")
        ax.tick_params(labelsize=7)
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle("published claims vs this testbed's simulator (grey band: the range we accept)", fontsize=9)
    save(fig, path)
    return path

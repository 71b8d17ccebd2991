"""BubbleTea's knee without and with fill work, side by side: two `testbed sim` output folders of the same sweep,
the second with `bubbletea.fill` (what `make sim-bubbletea` writes). Fill takes only what training and prefill
leave, so the knee, its SLO attainment and the training slowdown must be the same in both; this prints what fill
adds (GPU time, useful work, its own goodput) and fails if anything else moved.
Run: .venv/bin/python bench/bubbletea_fill_knee.py WITHOUT_DIR WITH_DIR
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

SAME = ("knee_request_rate", "goodput_rps", "slo_attainment", "train_slowdown", "served_in_bubbles")


def knee_rows(folder: Path) -> dict[tuple[str, str], dict]:
    with (folder / "knee.csv").open(newline="") as f:
        return {(r["scheduler"], r["source"]): r for r in csv.DictReader(f)}


def pct(x: str) -> str:
    return f"{100 * float(x):.1f} %" if x != "" else "-"


def compare(without: dict[tuple[str, str], dict], with_fill: dict[tuple[str, str], dict]
            ) -> tuple[list[str], list[str]]:
    """The table's lines, and what moved that fill must not move."""
    lines = ["| scheduler | knee (requests/s) | GPU time: without -> with fill | useful work: without -> with fill | "
             "prefill goodput (requests/s), SLO attainment | fill goodput: jobs/s, tokens/s (deadline met) | "
             "training slowdown |",
             "|---|---|---|---|---|---|---|"]
    moved = []
    for key in sorted(with_fill):
        a, b = without.get(key), with_fill[key]
        if a is None:
            moved.append(f"{key[0]}: no knee row without fill")
            continue
        moved += [f"{key[0]}: {c} {a[c]} -> {b[c]}" for c in SAME if a[c] != b[c]]
        if b["knee_request_rate"] == "":
            lines.append(f"| {key[0]} | none | | | | | |")
            continue
        lines.append(f"| {key[0]} | {float(b['knee_request_rate']):.1f} | {pct(a['gpu_util'])} -> "
                     f"{pct(b['gpu_util'])} | {pct(a['useful_util'])} -> {pct(b['useful_util'])} | "
                     f"{float(b['goodput_rps']):.1f}, {pct(b['slo_attainment'])} | "
                     f"{float(b['fill_goodput_jobs_per_s']):.2f}, {float(b['fill_goodput_tokens_per_s']):,.0f} "
                     f"({pct(b['fill_deadline_met'])}) | {100 * float(b['train_slowdown'] or 0):+.2f} % |")
    return lines, moved


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1])
        return 2
    without, with_fill = (knee_rows(Path(p)) for p in sys.argv[1:])
    if not any("fill_util" in r for r in with_fill.values()):
        print(f"{sys.argv[2]}/knee.csv has no fill columns: run that sweep with bubbletea.fill")
        return 2
    lines, moved = compare(without, with_fill)
    print("BubbleTea knee without and with fill work (fill takes what prefill leaves)")
    print("\n".join(lines))
    for m in moved:
        print(f"MOVED (fill must not move it): {m}")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())

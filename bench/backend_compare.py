"""The same emulated experiment on several backends (default netns and docker), side by side.

Runs `testbed experiment run EXP --backend B` once per backend, then compares the emulated rows
metric by metric with the first backend's: e.g. docker / netns per scheduler. Writes OUT/<backend>/
(each run's own CSVs) and OUT/backends.csv. Needs root, and for docker a running engine and the role
images (`make images`); containernet runs from a venv where Containernet is installed (README).

Run: sudo .venv/bin/python bench/backend_compare.py experiments/emu-docker.yaml --out results/emu-docker
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

from testbed.results import fmt, write_csv

METRICS = ("iteration_s", "gpu_util", "bubble_frac", "served_in_bubbles")  # train_slowdown is ~0: no ratio
HEADER = ("scheduler", "metric", "base_backend", "base", "other_backend", "other", "ratio")


def run(exp: str, backend: str, out: Path, prefix: str | None) -> pd.DataFrame:
    testbed = str(Path(sys.executable).with_name("testbed"))
    subprocess.run([testbed, "experiment", "run", exp, "--backend", backend, *(["--prefix", prefix] if prefix else []),
                    "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    df = pd.read_csv(out / "summary.csv")
    return df[df["source"] == "emu"].set_index("scheduler")


def compare(base: pd.DataFrame, other: pd.DataFrame, names: tuple[str, str]) -> list[tuple]:
    rows = []
    for sched in base.index:
        for m in METRICS:
            a, b = base.at[sched, m], other.at[sched, m]
            if pd.isna(a) or pd.isna(b):
                continue
            rows.append((sched, m, names[0], fmt(a), names[1], fmt(b), fmt(b / a, 4) if a else ""))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("experiment")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--backends", default="netns,docker", help="BASE,OTHER[,OTHER...]")
    ap.add_argument("--prefix", default=None, help="emulation prefix (default: a free one per run)")
    args = ap.parse_args()
    names = args.backends.split(",")
    if len(names) < 2:
        sys.exit("error: --backends: give two or more backends, e.g. netns,docker")
    frames = {b: run(args.experiment, b, args.out / b, args.prefix) for b in names}
    rows = [r for b in names[1:] for r in compare(frames[names[0]], frames[b], (names[0], b))]
    write_csv(args.out / "backends.csv", HEADER, rows)
    print(f"{'scheduler':<18}{'metric':<19}{'base':>14}{'':>9}{'other':>14}{'':>9}{'ratio':>8}")
    for sched, m, na, a, nb, b, r in rows:
        print(f"{sched:<18}{m:<19}{na:>14}{float(a):>9.4f}{nb:>14}{float(b):>9.4f}{r:>8}")
    print(f"wrote {args.out / 'backends.csv'}")


if __name__ == "__main__":
    main()

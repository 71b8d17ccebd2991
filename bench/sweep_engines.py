"""Sweep engines: the same N-point sweep of experiments/tiny-3dc.yaml on the process pool and on a local Ray.

Prints each engine's wall time (Ray's includes starting it), their ratio, and whether the summaries are
byte-identical. A benchmark, not a test: numbers vary by machine and load (docs/sweeps.md).
Run: .venv/bin/python bench/sweep_engines.py [POINTS]   (default 1000)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from testbed.runs.simulated import run_experiment, write_outputs
from testbed.spec.load import load_experiment

EXP = Path(__file__).resolve().parent.parent / "experiments" / "tiny-3dc.yaml"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    lat = ",".join(str(round(1 + 0.1 * i, 1)) for i in range(n))
    points = load_experiment(EXP, sets=["timeline=none"], sweeps=[f"topology.links.*.latency_ms={lat}"])
    walls, outs = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in ("process", "ray"):
            t0 = time.perf_counter()
            res = run_experiment(points, engine=engine)
            walls[engine] = time.perf_counter() - t0
            outs[engine] = write_outputs(Path(tmp) / engine, res)[0].read_bytes()
    print(f"{n} points x {len(points[0][0].schedulers)} schedulers")
    for engine, wall in walls.items():
        print(f"{engine:<8} {wall:8.1f} s")
    same = outs["ray"] == outs["process"]
    print(f"ray / process: {walls['ray'] / walls['process']:.2f}; summaries identical: {same}")


if __name__ == "__main__":
    main()

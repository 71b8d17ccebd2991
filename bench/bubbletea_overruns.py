"""How long training waited for prefill in an emulated BubbleTea run, read from its timeline.csv: for each
prefill interval, the part after the group's next training input had arrived (the recv's end) - the
delay prefill itself caused, measured inside one run, apart from the run-to-run noise that a comparison
with a separate run without BubbleTea (`train_slowdown_vs_alone`) carries on a shared machine. `train_slowdown`
is what these waits cost the iteration (testbed/bubbletea/without_prefill.py: the same run replayed without them).
Run: .venv/bin/python bench/bubbletea_overruns.py RESULTS_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd


def overruns(tl: pd.DataFrame) -> pd.DataFrame:
    """One row per prefill interval during which training input arrived: run, group, iteration, seconds."""
    rows = []
    for (run, gpu), d in tl[(tl.source == "emu") & (tl.kind.isin(["prefill", "recv", "fwd", "bwd", "allreduce"]))] \
            .groupby(["run_id", "gpu"]):
        d = d.sort_values("start_s")
        ops = d[d.kind.isin(["fwd", "bwd", "allreduce"])]
        recvs = d[d.kind == "recv"]
        for p in d[d.kind == "prefill"].itertuples():
            nxt = ops[ops.start_s >= p.end_s - 1e-9]
            if nxt.empty:
                continue
            arrived = recvs[(recvs.end_s > p.start_s) & (recvs.end_s <= nxt.start_s.iloc[0] + 1e-9)].end_s
            if len(arrived) and arrived.min() < p.end_s:
                rows.append((run, gpu, p.iteration, p.end_s - arrived.min()))
    return pd.DataFrame(rows, columns=["run_id", "gpu", "iteration", "overrun_s"])


def main() -> None:
    folder = Path(sys.argv[1])
    tl = pd.read_csv(folder / "timeline.csv")
    s = pd.read_csv(folder / "summary.csv")
    o = overruns(tl)
    for run, d in s[(s.source == "emu") & s.scheduler.str.endswith("+bubbletea")].groupby("run_id"):
        mine = o[o.run_id == run]
        its = d.iteration_s.iloc[0]
        n = tl[(tl.run_id == run) & (tl.source == "emu")].iteration.nunique()
        per_it = mine.overrun_s.sum() / max(1, n)
        longest = mine.overrun_s.max() * 1e3 if len(mine) else 0.0
        print(f"{run}: {len(mine)} prefill intervals overran (training input arrived during them), "
              f"{mine.overrun_s.sum() * 1e3:.1f} ms in all, {per_it * 1e3:.1f} ms per iteration "
              f"({per_it / its:.2%} of an iteration; the longest {longest:.1f} ms); "
              f"train_slowdown {float(d.train_slowdown.iloc[0]):.2%} (in the run), "
              f"{float(d.train_slowdown_vs_alone.iloc[0]):.2%} against the separate run")


if __name__ == "__main__":
    main()

"""Why an emulated BubbleTea run serves fewer requests in bubbles than the simulator, read from its results:
how predictable the live idle gaps were, how much of the idle time the online planner could count on, how
much prefill ran, and how much training waited for it.

From timeline.csv it replays the service's gap model (testbed/bubbletea/online.py, WindowModel) over the
emulated atlas+bubbletea run's gaps, iteration by iteration, as the service saw them, and prints:
- idle: the training gaps' time (prefill ran inside it) and the part of it in gaps that can hold the
  smallest prefill;
- prediction error of a gap's end, two ways: as an offset from the iteration's start (how the first
  online version placed jobs) and as its live opening plus its predicted length (how workers admit jobs
  now), p10/p50/p90;
- the margin at the planner's starting quantile (WindowModel.MARGIN_QUANTILE of the shortfall of the predicted length;
  the service then moves the quantile with training's measured wait, which a replay cannot know) and
  the share of the idle time predicted usable after it;
- prefill busy time as a share of the idle time, in the simulator (exact bubbles) and the emulator;
- the gaps that can hold a job (the smallest prefill and both guard bands), per iteration, simulated and
  emulated, with and without BubbleTea: what the emulated training offers, whatever the service does;
- the share of requests served in bubbles over the requests both engines were offered (the slower run is
  offered requests arriving after the other's ended), and by the iteration they arrived in, in both engines
  (the last iterations' requests find no bubble before the run ends in either);
- overruns (bench/bubbletea_overruns.py) and the share of jobs handed out that did not run.
Run: .venv/bin/python bench/bubbletea_online.py RESULTS_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path
from statistics import median

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bubbletea_overruns import overruns  # noqa: E402

from testbed.bubbletea.online import WindowModel, quantile  # noqa: E402
from testbed.costs.models import MODELS  # noqa: E402
from testbed.costs.prefill_model import prefill_time_s  # noqa: E402

TRAINING = ["fwd", "bwd", "allreduce"]


def gaps_by_iteration(tl: pd.DataFrame) -> dict[str, list[tuple[int, list[tuple[int, float, float]]]]]:
    """Per group, per iteration: its gaps (index, start, end) as offsets from the iteration's start, the last
    one running to the end of the last training op anywhere (what the service learns)."""
    starts = tl.groupby("iteration").start_s.min()
    tr = tl[tl.kind.isin(TRAINING)]
    train_end = tr.groupby("iteration").end_s.max()
    out: dict[str, list] = {}
    for (it, g), d in tr.groupby(["iteration", "gpu"]):
        t0, cur, gaps = starts[it], 0.0, []
        d = d.sort_values("start_s")
        for n, x in enumerate(d.itertuples()):
            if x.start_s - t0 > cur + 1e-6:
                gaps.append((n, cur, x.start_s - t0))
            cur = max(cur, x.end_s - t0)
        if train_end[it] - t0 > cur + 1e-6:
            gaps.append((len(d), cur, train_end[it] - t0))
        out.setdefault(g, []).append((it, gaps))
    return out


def pct(xs: list[float]) -> str:
    return "/".join(f"{quantile(xs, q) * 1e3:+.1f}" for q in (0.1, 0.5, 0.9)) + " ms" if xs else "-"


def report(folder: Path) -> None:
    tl = pd.read_csv(folder / "timeline.csv")
    s = pd.read_csv(folder / "summary.csv")
    spec = __import__("yaml").safe_load((folder / "spec.yaml").read_text())
    bt = spec.get("bubbletea", {})
    model = MODELS[bt.get("model", "llama2-7b")]
    for run, row in s[(s.source == "emu") & s.scheduler.str.endswith("+bubbletea")].set_index("run_id").iterrows():
        e = tl[(tl.run_id == run) & (tl.source == "emu")]
        sim = tl[(tl.run_id == run) & (tl.source == "sim")]
        gpu = min(d["gpu"] for d in spec["topology"]["dcs"])
        smallest = prefill_time_s(model, gpu, spec["workload"]["tp"], 1,  # the smallest job (modeled compute)
                                  kind=bt.get("prefill_model", "ops"))
        history = WindowModel().history
        m = WindowModel(history)
        m.min_gap_s = smallest
        offset_err, anchored_err, margins, usable, idle, idle_long = [], [], [], 0.0, 0.0, 0.0
        for g, its in gaps_by_iteration(e).items():
            m.seen.pop(g, None)
            for k, (_it, gaps) in enumerate(its):
                if k >= history:
                    lengths = m.lengths(g)
                    past = list(m.seen[g])
                    for n, a, b in gaps:
                        if lengths.get(n, 0.0) > smallest:
                            offs = [p[n][1] for p in past if n in p]
                            offset_err.append(b - median(offs))
                            anchored_err.append(b - (a + lengths[n]))
                    margins.append(m.margin_s)
                    usable += sum(max(0.0, lengths.get(n, 0.0) - m.margin_s) for n, a, b in gaps
                                  if lengths.get(n, 0.0) - m.margin_s > smallest)
                    idle += sum(b - a for _n, a, b in gaps)
                    idle_long += sum(b - a for _n, a, b in gaps if b - a > smallest)
                m.observe(g, gaps)
        pre_e = e[e.kind == "prefill"]
        busy_e = float((pre_e.end_s - pre_e.start_s).sum())
        idle_all = float(sum(b - a for its in gaps_by_iteration(e).values() for _it, gs in its for _n, a, b in gs))
        sim_gaps = gaps_by_iteration(sim)
        idle_sim = float(sum(b - a for its in sim_gaps.values() for _it, gs in its for _n, a, b in gs))
        pre_s = sim[sim.kind == "prefill"]
        busy_s = float((pre_s.end_s - pre_s.start_s).sum())
        sim_row = s[(s.run_id == run) & (s.source == "sim")].iloc[0]
        o = overruns(e)
        n_it = e.iteration.nunique()
        print(f"{run}: served in bubbles {row.served_in_bubbles:.1%} emulated, {sim_row.served_in_bubbles:.1%} "
              f"simulated ({row.served_in_bubbles / sim_row.served_in_bubbles:.2f}); iteration "
              f"{row.iteration_s:.3f} s emulated, {sim_row.iteration_s:.3f} s simulated")
        print(f"  gaps scored from iteration {history + 1} on: idle {idle:.2f} s, {idle_long / idle:.0%} of it in gaps "
              f"longer than the smallest prefill ({smallest * 1e3:.1f} ms)")
        print(f"  gap end predicted as an offset from the iteration's start: error p10/p50/p90 {pct(offset_err)}")
        print(f"  gap end predicted as live opening + predicted length:      error p10/p50/p90 {pct(anchored_err)}")
        print(f"  margin at the planner's starting quantile ({m.quantile:.2f} of the predicted length's shortfall): "
              f"{median(margins) * 1e3:.1f} ms; predicted usable after it: {usable / idle:.0%} of the idle time")
        print(f"  prefill busy: {busy_e / idle_all:.0%} of the idle time emulated ({busy_e:.2f} s), "
              f"{busy_s / idle_sim:.0%} simulated ({busy_s:.2f} s, exact bubbles)")
        need = smallest + 2 * bt.get("guard_ms", 0.0) / 1e3
        base = run[:-len("+bubbletea")]
        (sim_s, sim_n), (emu_s, emu_n), (alone_s, alone_n) = (long_gaps(tl, r, src, need) for r, src in
                                                              ((run, "sim"), (run, "emu"), (base, "emu")))
        print(f"  training's gaps that hold the smallest prefill and the guard bands, per iteration (median): "
              f"simulated {sim_s:.3f} s in {sim_n:.0f}; emulated {emu_s:.3f} s in {emu_n:.0f}, and {alone_s:.3f} s in "
              f"{alone_n:.0f} without BubbleTea ({alone_s / sim_s:.2f} of the simulated)")
        same = same_requests(folder, run)
        print(f"  over the {same[2]} requests both engines were offered: {same[1]:.1%} emulated, {same[0]:.1%} "
              f"simulated ({same[1] / same[0]:.2f}); the simulator serves {same[3]} of them in bubbles that the "
              f"emulator does not, the emulator {same[4]} that the simulator does not")
        by_it = served_by_iteration(folder, run)
        for src in ("sim", "emu"):
            print(f"  served in bubbles by arrival iteration, {src}: " + " ".join(f"{v:.2f}" for v in by_it[src]))
        print(f"  training waited for prefill (overruns): {o.overrun_s.sum() / n_it * 1e3:.1f} ms per iteration "
              f"({o.overrun_s.sum() / n_it / row.iteration_s:.2%}), {len(o)} intervals; jobs handed out and not run: "
              f"{row.prefill_skipped:.0%}")


def long_gaps(tl: pd.DataFrame, run: str, source: str, min_s: float) -> tuple[float, float]:
    """Median per steady iteration of the total length and number of training's gaps longer than `min_s` (those
    that can hold a job) in a run: the bubbles the emulated training offers, whatever the service does."""
    t = tl[(tl.run_id == run) & (tl.source == source)]
    if t.empty:
        return 0.0, 0.0
    per: dict[int, list[float]] = {}
    for its in gaps_by_iteration(t).values():
        for it, gaps in its:
            per.setdefault(it, []).extend(b - a for _n, a, b in gaps if b - a > min_s)
    steady = sorted(per)[1:] if source == "emu" and len(per) > 1 else sorted(per)
    return median(sum(per[i]) for i in steady), median(len(per[i]) for i in steady)


def same_requests(folder: Path, run: str) -> tuple[float, float, int, int, int]:
    """Over the requests both engines were offered (validation.csv's served_in_bubbles@same_requests): the share
    served in bubbles, simulated and emulated, how many, and how many each serves in bubbles that the other does not."""
    q = pd.read_csv(folder / "requests.csv")
    q = q[q.run_id == run]
    both = q.pivot_table(index="request_id", columns="source", values="in_bubble").dropna()
    return (float(both.sim.mean()), float(both.emu.mean()), len(both), int(((both.sim == 1) & (both.emu == 0)).sum()),
            int(((both.emu == 1) & (both.sim == 0)).sum()))


def served_by_iteration(folder: Path, run: str) -> dict[str, list[float]]:
    """Per engine, the share of the requests arriving in each steady iteration that were served in bubbles."""
    q = pd.read_csv(folder / "requests.csv")
    tl = pd.read_csv(folder / "timeline.csv")
    out = {}
    for src in ("sim", "emu"):
        starts = tl[(tl.run_id == run) & (tl.source == src)].groupby("iteration").start_s.min().sort_values()
        r = q[(q.run_id == run) & (q.source == src)]
        its = pd.cut(r.arrival_s, [*starts.values, float("inf")], labels=list(starts.index), right=False)
        out[src] = [float(v) for v in r.in_bubble.groupby(its, observed=True).mean().values]
    return out


def main() -> None:
    report(Path(sys.argv[1]))


if __name__ == "__main__":
    main()

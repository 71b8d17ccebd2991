"""Figures that follow the sweep, Gantt lanes from the simulator's own transfers, and the column registry."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from testbed import columns
from testbed.analysis.metrics import KV_WAN_COLUMNS, SUMMARY_HEADER
from testbed.analysis.sweep import axes, parse_point, short_names, with_sweep_columns
from testbed.figures import sweep
from testbed.figures.draw import draw_all
from testbed.figures.gantt import common_iteration, wan_transfers, with_peers
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.spec.load import load_experiment
from testbed.timeline import HEADER
from tests.conftest import ROOT


def test_sweep_points_parse_and_pick_the_x_axis():
    assert parse_point("a.b=5;c=x;d=2.5") == {"a.b": 5.0, "c": "x", "d": 2.5}
    assert parse_point("") == {} and parse_point(float("nan")) == {}
    df = pd.DataFrame({"sweep": [f"t.links.*.latency_ms={lat};t.links.*.gbps={c}" for lat in (5, 20, 50)
                                 for c in (100, 400)], "scheduler": "atlas"})
    df, keys = with_sweep_columns(df)
    assert keys == ["t.links.*.latency_ms", "t.links.*.gbps"]
    assert axes(df, keys) == ("t.links.*.latency_ms", ["t.links.*.gbps"])  # more values -> x
    assert short_names(["links.0.gbps", "links.1.gbps", "a.latency_ms"]) == {
        "links.0.gbps": "0.gbps", "links.1.gbps": "1.gbps", "a.latency_ms": "latency_ms"}
    assert axes(df.assign(**{"t.links.*.latency_ms": 5.0}), keys) == ("t.links.*.gbps", [])


def test_log_axis_only_for_geometric_values_and_overlaps_are_found():
    assert sweep.log_scale([100, 400, 1600]) and sweep.log_scale([1, 2, 4, 8, 16])
    assert not sweep.log_scale([5, 10, 20, 35, 50, 70]) and not sweep.log_scale([1, 2])
    x = np.array([5.0, 20, 50])
    assert sweep.coincide(x, np.array([10.0, 20, 30]), x, np.array([10.05, 20.1, 29.9]))
    assert not sweep.coincide(x, np.array([10.0, 20, 30]), x, np.array([10.0, 20, 33]))


def test_speedup_is_each_scheduler_over_atlas_at_the_same_point():
    df = pd.DataFrame({"scheduler": ["pp-wan", "atlas", "pp-wan", "atlas"], "source": "sim", "k": [1, 1, 2, 2],
                       "iteration_s": [6.0, 2.0, 9.0, 3.0]})
    assert sweep.speedup_values(df, ["k"]).tolist() == [3.0, 1.0, 3.0, 1.0]
    assert sweep.speedup_values(df[df.scheduler == "pp-wan"], ["k"]) is None


def test_a_2d_sweep_draws_one_figure_per_metric_and_says_what_it_skips(tmp_path):
    rows = []
    for i, (lat, cap) in enumerate([(lat, cap) for lat in (5, 20, 50) for cap in (100, 400)]):
        for s, base in (("dp-wan", 12.0), ("pp-wan", 7.0), ("pp-wan+temporal", 7.0), ("atlas", 3.0)):
            it = base * (1 + lat / 25) * (400 / cap) ** 0.5 if s != "dp-wan" else base
            rows.append({"run_id": f"p{i:02d}-{s}", "source": "sim", "scheduler": s, "model": "m", "dcs": "a|b",
                         "gpus": 64, "iteration_s": it, "tokens_per_s_per_gpu": 1e3 / it, "gpu_util": 1 / it,
                         "lower_bound_s": 2.5,
                         "sweep": f"topology.links.*.latency_ms={lat};topology.links.*.gbps={cap}"})
    pd.DataFrame(rows).to_csv(tmp_path / "summary.csv", index=False)
    notes: list[str] = []
    names = {p.name for p in draw_all(tmp_path, tmp_path / "fig", notes)}
    assert names == {"iteration_s_vs_latency_ms.png", "tokens_per_s_per_gpu_vs_latency_ms.png",
                     "gpu_util_vs_latency_ms.png", "speedup_vs_latency_ms.png"}
    assert any("gpu_util.png" in n for n in notes) and any("no timeline.csv" in n for n in notes)


def test_one_point_gets_bars_not_lines(tmp_path):
    pd.DataFrame([{"run_id": f"p00-{s}", "source": "sim", "scheduler": s, "iteration_s": t, "gpu_util": 0.5,
                   "lower_bound_s": 1.0, "sweep": ""} for s, t in (("pp-wan", 3.0), ("atlas", 1.2))]
                 ).to_csv(tmp_path / "summary.csv", index=False)
    names = {p.name for p in draw_all(tmp_path, tmp_path / "fig")}
    assert names == {"iteration_s.png", "gpu_util.png"}


def sim_timeline(sched: str) -> pd.DataFrame:
    sets = ["workload.pp=4", "workload.global_batch=8", "topology.dcs.*.gpus=4"]  # 2 stages per DC: LAN and WAN
    exp, _ = load_experiment(ROOT / "experiments" / "tiny-3dc.yaml", sets)[0]
    tl, _ = simulate(build_plan(exp, sched, run_id=f"p00-{sched}"))
    return pd.DataFrame([(tl.run_id, tl.source, *iv) for iv in tl.repeated(2).intervals], columns=list(HEADER))


def test_gantt_peers_match_the_simulators_own_transfers():
    """The rule that names a transfer's peer stage, checked against the simulator, which records each
    transfer's send at its source and its receive at its destination with the same start."""
    for sched in ("pp-wan", "atlas"):
        tl = sim_timeline(sched)
        x = with_peers(tl)
        assert len(x) == (tl.kind.isin(["send", "recv"])).sum() > 0
        s, r = x[x.kind == "send"], x[x.kind == "recv"]
        m = s.merge(r, left_on=["iteration", "replica", "microbatch", "start_s", "peer"],
                    right_on=["iteration", "replica", "microbatch", "start_s", "stage"], suffixes=("", "_r"))
        assert len(m) == len(s) and (m.peer_r == m.stage).all() and (m.grad == m.grad_r).all()
        assert not s[s.stage == 0].grad.any() and s[s.stage == s.stage.max()].grad.all()
        w = wan_transfers(tl)
        assert len(w) and (w.dc != w.peer_dc).all()
        assert common_iteration(tl, f"p00-{sched}") == 0
        emu = tl[tl.iteration > 0].assign(source="emu")  # emulated timelines leave out iteration 0
        assert common_iteration(pd.concat([tl, emu]), f"p00-{sched}") == 1


def test_every_csv_column_is_documented_and_the_doc_is_current():
    from testbed.analysis.flows import FLOWS_HEADER as CAPTURE_HEADER
    from testbed.bubbletea.bubbles import BUBBLES_HEADER
    from testbed.bubbletea.knee import KNEE_HEADER
    from testbed.bubbletea.run import REQUESTS_HEADER
    from testbed.claims import CLAIMS_HEADER, POINTS_HEADER
    from testbed.emu.check import LINKS_HEADER
    from testbed.launch.check import CHECK_HEADER
    from testbed.launch.dilation import FLOWS_SCALE_COLUMNS, SCALE_HEADER
    from testbed.launch.run import RANKS_HEADER
    from testbed.runs.emulated import CPU_PREFILL_HEADER, FLOWS_HEADER, LOSS_HEADER, VALIDATION_HEADER
    from testbed.runs.multitcp import HEADER as MULTITCP_HEADER
    from testbed.runs.simulated import ITERATIONS_HEADER, LINKCHANGES_HEADER, LINKRATES_HEADER

    written = {"summary.csv": SUMMARY_HEADER + KV_WAN_COLUMNS, "summary.csv (multitcp)": MULTITCP_HEADER,
               "timeline.csv": HEADER,
               "requests.csv": REQUESTS_HEADER, "bubbles.csv": BUBBLES_HEADER, "validation.csv": VALIDATION_HEADER,
               "loss.csv": LOSS_HEADER, "flows.csv": FLOWS_HEADER, "flows.csv (capture)": CAPTURE_HEADER,
               "links.csv": LINKS_HEADER, "claims.csv": CLAIMS_HEADER, "claims_points.csv": POINTS_HEADER,
               "iterations.csv": ITERATIONS_HEADER, "linkchanges.csv": LINKCHANGES_HEADER,
               "linkrates.csv": LINKRATES_HEADER, "knee.csv": KNEE_HEADER, "cpu_prefill.csv": CPU_PREFILL_HEADER,
               "ranks.csv": RANKS_HEADER, "scale.csv": SCALE_HEADER, "check.csv": CHECK_HEADER}
    written["flows.csv (capture)"] = (*CAPTURE_HEADER, *FLOWS_SCALE_COLUMNS)  # a launch's capture adds these
    registry = {f.name: [c.name for c in f.columns] for f in columns.FILES}
    for name, header in written.items():
        missing = [c for c in header if c not in registry[name]]
        assert not missing, f"{name}: document {missing} in testbed/columns.py"
    doc = (ROOT / "docs" / "outputs.md").read_text()
    assert columns.rewrite(doc) == doc, "docs/outputs.md is stale: python -m testbed.columns --write docs/outputs.md"
    assert re.search(r"\| `estimate_s` \| s \|", doc)
    assert columns.label("iteration_s") == "iteration time (s)" and columns.label("gpu_util").endswith("(%)")
    assert columns.unit("topology.links.*.gbps") == "Gbit/s" and columns.unit("a_new_thing_ms") == "ms"

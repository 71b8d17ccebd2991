"""`testbed sim`, `plan` and `figures` end to end, as a user runs them."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

TINY = str(ROOT / "experiments" / "tiny-3dc.yaml")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True, text=True, cwd=ROOT,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_sim_is_byte_identical_across_runs(tmp_path):
    outs = []
    for name in ("a", "b"):
        r = run_cli("sim", TINY, "--out", str(tmp_path / name), "--sweep", "topology.links.*.latency_ms=5,30")
        assert r.returncode == 0, r.stderr
        outs.append(tmp_path / name)
    for f in ("summary.csv", "timeline.csv", "trace.json"):
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes(), f
    header = (outs[0] / "summary.csv").read_text().splitlines()[0].split(",")
    for col in ("run_id", "source", "scheduler", "iteration_s", "tokens_per_s", "gpu_util", "bubble_frac",
                "lower_bound_s", "tcp_connections", "wan_latency_ms"):
        assert col in header
    assert len((outs[0] / "summary.csv").read_text().splitlines()) == 1 + 2 * 3
    assert not [p for p in outs[0].iterdir() if p.name.startswith(".")]  # no temp files left


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    r = run_cli("sim", TINY, "--out", str(tmp_path / "x"), "--set", "topology.links.0.latency_ms=-3")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "topology.links.0.latency_ms" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "x").exists()


def test_figures_from_csv(tmp_path):
    out = tmp_path / "r"
    assert run_cli("sim", TINY, "--out", str(out), "--sweep", "topology.links.*.latency_ms=5,30").returncode == 0
    r = run_cli("figures", str(out))
    assert r.returncode == 0, r.stderr
    pngs = {p.name for p in (out / "figures").glob("*.png")}
    assert {"iteration_s_vs_latency_ms.png", "speedup_vs_latency_ms.png", "gpu_util_vs_latency_ms.png"} <= pngs
    assert "gpu_util.png" not in pngs and "gpu_util.png (bars per scheduler) skipped" in r.stdout
    assert any(n.startswith("gantt_") for n in pngs)
    assert all((out / "figures" / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in pngs)


def test_plan_chooses_dcs(tmp_path):
    r = run_cli("plan", str(ROOT / "topologies" / "3dc.yaml"), "--model", "tiny", "--global-batch", "48",
                "--out", str(tmp_path / "plan.csv"))
    assert r.returncode == 0, r.stderr
    rows = (tmp_path / "plan.csv").read_text().splitlines()
    assert rows[0] == ("family,scheduler,dcs,order,stages,replicas,layers,tp,pp,dp,microbatch,microbatches,gpus,"
                       "idle_gpus,mem_gb,estimate_s,iteration_s,lower_bound_s,tokens_per_s,tokens_per_s_per_gpu,"
                       "token_efficiency,effective_tokens_per_s,status")
    assert rows[1].endswith(",best")
    answers = [row.split(",") for row in rows if row.endswith(",best of its family and DC set")]
    # the pipeline family on every other DC set, the three data-parallel ones on each set of 2-3 DCs, hybrids on 3
    assert sum(a[0] == "pipeline" for a in answers) >= 6 - (rows[1].split(",")[0] == "pipeline")
    assert {a[0] for a in answers} | {rows[1].split(",")[0]} == {"pipeline", "dp-wan", "diloco", "streaming-diloco",
                                                                  "hybrid"}
    assert {row.split(",")[7] for row in rows[1:]} >= {"1", "2", "4"}  # tp was searched
    assert "one site or several" in r.stdout and "planner wall time" in r.stdout and "best plan: the " in r.stdout
    assert (tmp_path / "answer.html").exists() and (tmp_path / "answer.png").exists()


def test_plan_sweep_writes_the_answer_and_keeps_the_best_rising(tmp_path):
    r = run_cli("plan", str(ROOT / "topologies" / "3dc.yaml"), "--model", "tiny", "--global-batch", "48", "--tp", "1",
                "--sweep", "topology.links.*.gbps=1,10", "--out", str(tmp_path / "d"))
    assert r.returncode == 0, r.stderr
    import pandas as pd

    plan = pd.read_csv(tmp_path / "d" / "plan.csv")
    assert list(plan["sweep"].unique()) == ["topology.links.*.gbps=1", "topology.links.*.gbps=10"]
    best = plan[plan["status"] == "best"].set_index("sweep")["effective_tokens_per_s"]
    assert best["topology.links.*.gbps=10"] >= best["topology.links.*.gbps=1"]
    page = (tmp_path / "d" / "answer.html").read_text()
    assert "data:image/png;base64," in page and all(f in page for f in ("pipeline", "dp-wan", "streaming-diloco"))
    shown = run_cli("show", str(tmp_path / "d"))
    assert shown.returncode == 0, shown.stderr
    kept = int((plan["status"].str.startswith("best")).sum())
    assert f"the best of every family and DC set ({kept} of {len(plan):,} layouts)" in shown.stdout
    assert "rejected" not in shown.stdout


def test_plan_rejects_a_scheduler_with_its_own_placement(tmp_path):
    r = run_cli("plan", str(ROOT / "topologies" / "3dc.yaml"), "--model", "tiny", "--scheduler", "pp-wan",
                "--out", str(tmp_path / "plan.csv"))
    assert r.returncode == 2
    assert "--scheduler" in r.stderr and "pp-wan+greedy" in r.stderr
    assert not (tmp_path / "plan.csv").exists()


def test_bubbletea_sweep_writes_the_knee_and_its_figures(tmp_path):
    from testbed.figures.draw import draw_all
    from testbed.runs.simulated import run_experiment, write_outputs
    from testbed.spec.load import load_experiment

    out = tmp_path / "bt"
    pts = load_experiment(ROOT / "experiments" / "emu-bubbletea.yaml",
                          ["schedulers=[atlas+bubbletea]", "bubbletea.fallback_gpus=1", "iterations=2"],
                          ["bubbletea.rate_scale=5,200"])
    write_outputs(out, run_experiment(pts, jobs=1))
    knee = (out / "knee.csv").read_text().splitlines()
    assert knee[0].startswith("scheduler,source,knee_request_rate") and len(knee) == 2
    pngs = {p.name for p in draw_all(out, out / "figures")}
    assert {"load_sweep_sim.png", "ttft_cdf_bubble_pool_sim.png", "gantt_prefill_p00-atlas+bubbletea.png"} <= pngs

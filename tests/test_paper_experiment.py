"""Invariants of experiments/paper-3dc.yaml's schedulers, checked on the simulator's own output at the
sweep's two ends (the whole sweep is `make sim-paper`)."""

from __future__ import annotations

import pytest

from testbed.runs.simulated import run_experiment
from testbed.spec.load import load_experiment
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def paper_rows():
    points = load_experiment(ROOT / "experiments" / "paper-3dc.yaml",
                             sets=["timeline=none", "schedulers=[pp-1tcp,pp-wan,pp-wan+mtcp,atlas]"],
                             sweeps=["topology.links.*.latency_ms=5,70"])
    return [r.summary for r in run_experiment(points)]


def test_every_row_names_its_best_baseline(paper_rows):
    for r in paper_rows:
        assert r["best_baseline"] in ("pp-1tcp", "pp-wan", "pp-wan+mtcp"), r
        if r["scheduler"] == r["best_baseline"]:
            assert r["speedup_vs_best"] == 1.0
        assert r["speedup_vs_best"] == pytest.approx(
            min(q["iteration_s"] for q in paper_rows if q["sweep"] == r["sweep"] and q["scheduler"] != "atlas")
            / r["iteration_s"], rel=1e-5)


def test_nothing_beats_its_lower_bound(paper_rows):
    for r in paper_rows:
        assert r["iteration_s"] >= r["lower_bound_s"] * (1 - 1e-9), r


def test_deployed_nccl_pipeline_opens_tp_streams_of_nccl_sockets(paper_rows):
    conns = {r["scheduler"]: r["tcp_connections"] for r in paper_rows}
    assert conns["pp-1tcp"] == 1
    assert conns["pp-wan"] == 8 * 2  # tp 8 x 2 NCCL channels per peer x 1 socket
    assert conns["pp-wan+mtcp"] >= conns["pp-wan"]


def test_more_connections_never_hurt_a_window_bound_pipeline(paper_rows):
    """Same placement and sharing, more connections: pp-1tcp >= pp-wan >= pp-wan+mtcp at every point."""
    by = {(r["sweep"], r["scheduler"]): r["iteration_s"] for r in paper_rows}
    for point in {r["sweep"] for r in paper_rows}:
        assert by[(point, "pp-1tcp")] >= by[(point, "pp-wan")] * (1 - 1e-9) >= by[(point, "pp-wan+mtcp")] * (1 - 2e-9)

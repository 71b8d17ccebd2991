"""Sweeps on a cluster engine: Ray gives the same CSVs as the process pool, byte for byte."""

from __future__ import annotations

import pytest

from testbed.errors import SpecError
from testbed.runs.simulated import run_experiment, write_outputs
from testbed.spec.load import load_experiment
from tests.conftest import ROOT

SWEEP = ["topology.links.*.latency_ms=5,20,40"]


def _points():
    return load_experiment(ROOT / "experiments" / "tiny-3dc.yaml", sweeps=SWEEP)


def test_process_pool_reports_progress_and_keeps_sweep_order(tmp_path):
    ticks = []
    serial = run_experiment(_points(), jobs=1, on_point=lambda i, res: ticks.append(i))
    pooled = run_experiment(_points(), jobs=2)
    assert sorted(ticks) == [0, 1, 2]
    a = write_outputs(tmp_path / "a", serial)
    b = write_outputs(tmp_path / "b", pooled)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]


def test_unknown_engine_is_a_one_line_error():
    with pytest.raises(SpecError, match="--engine"):
        run_experiment(_points(), engine="spark")


@pytest.mark.slow
def test_ray_gives_the_process_pools_csvs_byte_for_byte(tmp_path, monkeypatch):
    """About 17 s here, nearly all of it a local Ray starting on a busy 2-core machine (docs/sweeps.md)."""
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only, read when ray is imported
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    ticks = []
    on_ray = run_experiment(_points(), jobs=2, engine="ray", on_point=lambda i, res: ticks.append((i, len(res))))
    assert sorted(ticks) == [(0, 3), (1, 3), (2, 3)]  # each point heard of once, with its 3 schedulers
    pooled = run_experiment(_points(), jobs=2)
    a = write_outputs(tmp_path / "ray", on_ray)
    b = write_outputs(tmp_path / "pool", pooled)
    assert [p.name for p in a] == [p.name for p in b]
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]

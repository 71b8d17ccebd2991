"""Every emulated run measures its timing health; a run over its timing budget is marked degraded, and
`--strict` turns that into a one-line error (the CSVs still written whole)."""

from __future__ import annotations

import csv

from testbed.analysis.metrics import HEALTH_COLUMNS
from tests.conftest import ROOT
from tests.integration.conftest import cli, snapshot_of

EXP = str(ROOT / "experiments" / "emu-3dc.yaml")
PREFIX = "gdtbth"


def test_a_run_over_its_timing_budget_is_degraded_and_strict_fails(tmp_path):
    """A budget of 0: any measured lateness is over it."""
    r = cli("experiment", "run", EXP, "--out", str(tmp_path), "--set", "schedulers=[pp-wan]", "--set", "iterations=2",
            "--prefix", PREFIX, "--timing-budget", "0", "--strict")
    assert r.returncode == 1, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("emulation error:")]
    assert len(errors) == 1 and "degraded (--strict)" in errors[0] and "timing error" in errors[0], r.stderr
    assert "Traceback" not in r.stderr
    rows = list(csv.DictReader((tmp_path / "summary.csv").read_text().splitlines()))
    emu = [x for x in rows if x["source"] == "emu"]
    assert emu and all(c in emu[0] for c in HEALTH_COLUMNS)
    assert "timing error" in emu[0]["degraded"] and float(emu[0]["timing_error"]) > 0
    assert float(emu[0]["run_queue"]) >= 0 and emu[0]["shaping_drops"] != ""
    assert not snapshot_of(PREFIX)["netns"]

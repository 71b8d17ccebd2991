"""Online BubbleTea's admission on the emulated WAN: workers start prefill only while idle, in gaps they
learnt live, and report what did not run. Prefixes gdtbo5..gdtbo9."""

from __future__ import annotations

import csv

from tests.conftest import ROOT
from tests.integration.conftest import cli
from tests.integration.test_bubbletea_online import ours

TRAINING = ("fwd", "bwd", "allreduce")


def rows(path) -> list[dict]:
    return list(csv.DictReader(path.read_text().splitlines()))


def test_prefill_starts_only_in_idle_gaps_and_every_handed_job_is_accounted(tmp_path):
    before = ours("gdtbo5")
    r = cli("experiment", "run", str(ROOT / "experiments" / "emu-bubbletea.yaml"), "--out", str(tmp_path),
            "--set", "schedulers=[atlas+bubbletea]", "--set", "iterations=6", "--set", "emulation.prefix=gdtbo5")
    assert r.returncode == 0, r.stderr
    emu = next(x for x in rows(tmp_path / "summary.csv") if x["source"] == "emu")
    assert float(emu["served_in_bubbles"]) > 0 and 0 <= float(emu["prefill_skipped"]) < 1
    tl = [x for x in rows(tmp_path / "timeline.csv") if x["source"] == "emu"]
    ops: dict[str, list[tuple[float, float]]] = {}
    for x in tl:
        if x["kind"] in TRAINING:
            ops.setdefault(x["gpu"], []).append((float(x["start_s"]), float(x["end_s"])))
    prefill = [x for x in tl if x["kind"] == "prefill"]
    assert prefill
    for p in prefill:  # a job (or its resumption) starts only while its worker has no training op running
        t = float(p["start_s"])
        assert not any(a + 1e-6 < t < b - 1e-6 for a, b in ops[p["gpu"]]), p
    assert ours("gdtbo5") == before

"""`testbed experiment run experiments/multitcp.yaml`, reduced to two points for CI time."""

from __future__ import annotations

import csv

from tests.conftest import ROOT
from tests.integration.conftest import cli, snapshot


def test_multitcp_emulated_next_to_simulated(tmp_path):
    before = snapshot()
    r = cli("experiment", "run", str(ROOT / "experiments" / "multitcp.yaml"), "--out", str(tmp_path),
            "--set", "multitcp.connections=[1,4]", "--set", "multitcp.seconds=2",
            "--sweep", "topology.links.*.latency_ms=40")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader((tmp_path / "summary.csv").read_text().splitlines()))
    emu = {int(x["tcp_connections"]): float(x["throughput_mbps"]) for x in rows if x["source"] == "emu"}
    sim = {int(x["tcp_connections"]): float(x["throughput_mbps"]) for x in rows if x["source"] == "sim"}
    assert set(emu) == set(sim) == {1, 4}
    assert emu[4] > 2.5 * emu[1]  # the window cap binds one connection; four carry about four times more
    for n in (1, 4):
        assert 0.6 * sim[n] < emu[n] < 1.5 * sim[n], (n, emu[n], sim[n])
    assert snapshot() == before

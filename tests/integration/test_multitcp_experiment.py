"""`testbed experiment run experiments/multitcp.yaml`, reduced to two points for CI time."""

from __future__ import annotations

import csv

from tests.conftest import ROOT
from tests.integration.conftest import cli, snapshot


def test_multitcp_emulated_next_to_simulated(tmp_path):
    before = snapshot()
    r = cli("experiment", "run", str(ROOT / "experiments" / "multitcp.yaml"), "--out", str(tmp_path),
            "--set", "multitcp.connections=[1,4]", "--set", "multitcp.seconds=2",
            "--set", "multitcp.warmup_s=0.5", "--sweep", "topology.links.*.latency_ms=40")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader((tmp_path / "summary.csv").read_text().splitlines()))
    by = {src: {int(x["tcp_connections"]): float(x["throughput_mbps"]) for x in rows if x["source"] == src}
          for src in ("sim", "emu", "emu-iperf3")}
    assert {x["source"] for x in rows} == set(by)
    assert all(set(v) == {1, 4} for v in by.values())
    sim, emu = by["sim"], by["emu"]
    assert emu[4] > 2.5 * emu[1]  # the window cap binds one connection; four carry about four times more
    assert emu[1] < 1.1 * sim[1]  # the workers' clamp holds one connection to its window per round trip
    for src in ("emu", "emu-iperf3"):
        for n in (1, 4):
            assert 0.6 * sim[n] < by[src][n] < 1.5 * sim[n], (src, n, by[src][n], sim[n])
    assert snapshot() == before

"""Crash recovery, coexistence and bad input, through the CLI as users run it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from testbed.emu import state
from tests.conftest import ROOT
from tests.integration.conftest import cli, snapshot, write_topology


def test_sigkill_mid_build_is_removed_by_clean(tmp_path):
    before = snapshot()
    topo = ROOT / "topologies" / "3dc.yaml"
    p = subprocess.Popen([sys.executable, "-m", "testbed", "topology", "up", str(topo), "--prefix", "gdtbk"],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # kill it once it has built part of the network
        st = state.load("gdtbk")
        if st and len(st["namespaces"]) >= 8:
            break
        time.sleep(0.01)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert snapshot()["netns"] - before["netns"], "the build was killed before it created anything"
    r = cli("clean", "--prefix", "gdtbk")
    assert r.returncode == 0, r.stderr
    time.sleep(0.2)
    assert snapshot() == before
    assert state.load("gdtbk") is None


def test_two_topologies_coexist(tmp_path):
    before = snapshot()
    t = write_topology(tmp_path / "t.yaml", latency=5)
    assert cli("topology", "up", str(t), "--prefix", "gdtba").returncode == 0
    try:
        r = cli("topology", "up", str(t), "--prefix", "gdtbb")
        assert r.returncode == 0, r.stderr
        for prefix in ("gdtba", "gdtbb"):
            r = cli("topology", "exec", "east-h0", "--prefix", prefix, "--", "ping", "-c", "2", "-W", "2", "10.80.1.1")
            assert r.returncode == 0 and " 0% packet loss" in r.stdout, r.stdout + r.stderr
        assert cli("topology", "down", "--prefix", "gdtba").returncode == 0
        r = cli("topology", "exec", "east-h0", "--prefix", "gdtbb", "--", "ping", "-c", "1", "-W", "2", "10.80.1.1")
        assert r.returncode == 0, "removing one topology broke the other"
        r = cli("topology", "up", str(t), "--prefix", "gdtbb")
        assert r.returncode == 1 and "already up" in r.stderr
    finally:
        cli("topology", "down", "--prefix", "gdtba")
        cli("topology", "down", "--prefix", "gdtbb")
    assert snapshot() == before


def test_malformed_topology_fails_before_creating_anything(tmp_path):
    before = snapshot()
    bad = {
        "duplicate": "dcs: [{name: a, gpus: 8}, {name: a, gpus: 8}]",
        "unknown": "dcs: [{name: a, gpus: 8}]\nlinks: [{between: [a, b], gbps: 1, latency_ms: 1}]",
        "zero bw": "dcs: [{name: a, gpus: 8}, {name: b, gpus: 8}]\nlinks: [{between: [a, b], gbps: 0, latency_ms: 1}]",
        "unsafe": "dcs: [{name: 'a;rm -rf', gpus: 8}]",
    }
    for what, text in bad.items():
        f = tmp_path / "bad.yaml"
        f.write_text(text)
        r = cli("topology", "up", str(f), "--prefix", "gdtbm")
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: topology."), (what, r.stderr)
    assert snapshot() == before


def test_check_writes_links_csv(tmp_path):
    t = write_topology(tmp_path / "t.yaml", gbps=0.1, latency=40, window_mb=0.25)  # 1 stream: 26 Mbit/s
    assert cli("topology", "up", str(t), "--prefix", "gdtbc").returncode == 0
    try:
        r = cli("topology", "check", "--prefix", "gdtbc", "--seconds", "2", "--streams", "4",
                "--out", str(tmp_path / "links.csv"))
        assert r.returncode == 0, r.stderr
        status = cli("topology", "status", "--prefix", "gdtbc")
        assert status.returncode == 0 and "gdtbc-wan-east-west" in status.stdout
    finally:
        cli("topology", "down", "--prefix", "gdtbc")
    rows = (tmp_path / "links.csv").read_text().splitlines()
    assert rows[0].startswith("link,configured_mbps,measured_mbps_1,measured_mbps_n")
    vals = dict(zip(rows[0].split(","), rows[1].split(","), strict=True))
    assert float(vals["rtt_min_ms"]) >= 20
    assert float(vals["measured_mbps_n"]) > 1.5 * float(vals["measured_mbps_1"])  # window-bound: streams add up
    # the workers' own transport, window-clamped: streams add up to the model's n windows per round trip
    assert float(vals["workers_mbps_n"]) > 1.5 * float(vals["workers_mbps_1"])
    assert float(vals["model_mbps_n"]) > 1.5 * float(vals["model_mbps_1"])
    assert json.loads(json.dumps(vals))["delay_method"] in ("netem", "nfqueue")

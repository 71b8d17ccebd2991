"""Prefixes everywhere: runs with their own prefixes one after the other while another prefix is up leave
it untouched, and a live run's prefix is refused by `clean` and `topology down` unless forced."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from testbed.emu import owner, state
from tests.conftest import ROOT
from tests.integration.conftest import cli, snapshot, write_topology

EXPERIMENT = """
name: tiny-2dc
topology: t.yaml
workload: {{model: tiny, global_batch: 4, microbatch: 1, tp: 1, pp: 2, dp: 1}}
schedulers: [pp-wan]
iterations: {iterations}
emulation: {{backend: netns, scale: 1}}
"""


def mine() -> dict[str, set[str]]:
    """conftest's snapshot, restricted to this test's prefixes (other runs may come and go meanwhile)."""
    return {k: {x for x in v if "gdtbo" in x} for k, v in snapshot().items()}


def ours(prefix: str) -> dict:
    """What a prefix has: namespaces, the processes in them, its state file and owner record."""
    ns = sorted(n.split()[0] for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
                .stdout.splitlines() if n.startswith(prefix + "-"))
    pids = {n: subprocess.run(["ip", "netns", "pids", n], capture_output=True, text=True).stdout.split() for n in ns}
    st = state.state_path(prefix)
    return {"netns": ns, "pids": pids, "state": st.read_text() if st.exists() else None,
            "owner": owner.read(prefix)}


def test_runs_with_other_prefixes_leave_an_up_topology_alone(tmp_path):
    before = mine()
    write_topology(tmp_path / "t.yaml", gbps=0.1, latency=5)
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT.format(iterations=2))
    long = tmp_path / "long.yaml"
    long.write_text(EXPERIMENT.format(iterations=400))
    assert cli("topology", "up", str(tmp_path / "t.yaml"), "--prefix", "gdtbo3").returncode == 0
    third = ours("gdtbo3")
    live = None
    try:
        assert third["netns"] and third["state"] and any(third["pids"].values())  # delay lines run in it
        for prefix in ("gdtbo1", "gdtbo2"):
            r = cli("experiment", "run", str(exp), "--prefix", prefix, "--out", str(tmp_path / prefix), timeout=120)
            assert r.returncode == 0, r.stderr
            assert f"on prefix {prefix}" in r.stdout and ours(prefix) == {"netns": [], "pids": {}, "state": None,
                                                                           "owner": None}
            assert ours("gdtbo3") == third, f"the run on {prefix} touched gdtbo3"
        spec = (tmp_path / "gdtbo2" / "spec.yaml").read_text()
        assert "prefix: gdtbo2" in spec and spec.startswith("# testbed experiment run")
        # the up topology's prefix is refused to a run, without touching it
        r = cli("experiment", "run", str(exp), "--prefix", "gdtbo3", "--out", str(tmp_path / "x"))
        assert r.returncode == 1 and "already up" in r.stderr
        assert ours("gdtbo3") == third

        # a live run's prefix: clean and down refuse it, --force removes it
        live = subprocess.Popen([sys.executable, "-m", "testbed", "experiment", "run", str(long), "--prefix", "gdtbo4",
                                 "--out", str(tmp_path / "gdtbo4")], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (owner.alive(owner.read("gdtbo4")) and state.load("gdtbo4")):
            time.sleep(0.05)
        assert owner.read("gdtbo4")["pid"] == live.pid
        for argv in (("clean", "--prefix", "gdtbo4"), ("topology", "down", "--prefix", "gdtbo4")):
            r = cli(*argv)
            assert r.returncode == 1 and f"belongs to a live run: pid {live.pid}" in r.stderr, r.stderr
        assert ours("gdtbo4")["netns"] and live.poll() is None
        r = cli("clean", "--prefix", "gdtbo4", "--force")
        assert r.returncode == 0, r.stderr
        assert ours("gdtbo4")["netns"] == [] and ours("gdtbo3") == third
    finally:
        if live is not None:
            if live.poll() is None:
                live.send_signal(signal.SIGTERM)
            live.wait(60)
        cli("clean", "--prefix", "gdtbo4", "--force")
        r = cli("topology", "exec", "east-h0", "--prefix", "gdtbo3", "--", "ping", "-c", "2", "-W", "2", "10.80.1.1")
        assert r.returncode == 0 and " 0% packet loss" in r.stdout, "gdtbo3 stopped carrying traffic"
        assert cli("topology", "down", "--prefix", "gdtbo3").returncode == 0
    assert all(ours(p) == {"netns": [], "pids": {}, "state": None, "owner": None}
               for p in ("gdtbo1", "gdtbo2", "gdtbo3", "gdtbo4"))
    assert mine() == before


def test_the_owner_record_names_the_process(tmp_path):
    """`topology up` (netns) leaves its record behind on purpose: not live, so `down` may remove it."""
    write_topology(tmp_path / "t.yaml", latency=1)
    assert cli("topology", "up", str(tmp_path / "t.yaml"), "--prefix", "gdtbo6").returncode == 0
    try:
        rec = json.loads((state.STATE_DIR / "gdtbo6.owner").read_text())
        assert "topology up" in rec["cmd"] and not owner.alive(rec)
        assert "owner record" in owner.in_use("gdtbo6")
    finally:
        assert cli("topology", "down", "--prefix", "gdtbo6").returncode == 0
    assert not (state.STATE_DIR / "gdtbo6.owner").exists() and os.geteuid() == 0

"""`testbed launch`: real torch.distributed jobs (gloo, CPU) across the emulated 3-DC WAN."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.integration.conftest import cli
from tests.integration.conftest import snapshot as machine_snapshot

pytest.importorskip("torch", reason="launch examples need torch (make venv installs the local CPU wheel)")
TOPO = str(ROOT / "experiments" / "emu-3dc-topology.yaml")


def snapshot(prefix: str) -> dict[str, set[str]]:
    """What this test's prefix could leave behind (other people's emulations come and go meanwhile)."""
    snap = machine_snapshot()
    return {k: {x for x in v if prefix in x} for k, v in snap.items()}


def rows(path) -> list[dict]:
    return list(csv.DictReader(path.read_text().splitlines()))


def test_pipeline_example_learns_across_three_dcs(tmp_path):
    before = snapshot("gdtbl5")
    r = cli("launch", TOPO, "--prefix", "gdtbl5", "--scale", "50", "--out", str(tmp_path), "--capture", "--",
            "python", "examples/pipeline_gpt.py", "--steps", "8", timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    ranks = rows(tmp_path / "ranks.csv")
    assert len(ranks) == 6 and {x["exit_code"] for x in ranks} == {"0"}
    assert "[r4 uswest-h0] step 0 loss" in r.stdout  # every rank's output, prefixed
    loss = [float(x["loss"]) for x in rows(tmp_path / "pipeline.csv")]
    assert len(loss) == 8 and loss[-1] < 0.8 * loss[0], loss
    flows = rows(tmp_path / "flows.csv")  # activations crossed the WAN between consecutive stages' DCs
    pairs = {(x["src_dc"], x["dst_dc"]) for x in flows if float(x["bytes"]) > 0}
    assert {("useast", "uscentral"), ("uscentral", "uswest")} <= pairs
    assert {x["replica"] for x in flows if x["src_dc"] == "useast" and x["dst_dc"] == "uscentral"} == {"0", "1"}
    assert snapshot("gdtbl5") == before


def test_diloco_and_ddp_run_and_compare(tmp_path):
    before = snapshot("gdtbl6")
    for method in ("ddp", "diloco"):
        r = cli("launch", TOPO, "--prefix", "gdtbl6", "--scale", "50", "--out", str(tmp_path), "--",
                "python", "examples/diloco.py", "--method", method, "--steps", "10", "--inner-steps", "5",
                timeout=240)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        ev = [x for x in rows(tmp_path / f"{method}.csv") if x["eval_loss"]]
        assert [int(x["step"]) for x in ev] == [5, 10] and float(ev[-1]["eval_loss"]) < float(ev[0]["eval_loss"])
    c = subprocess.run([sys.executable, "examples/compare_loss.py", str(tmp_path), "--target", "10"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert c.returncode == 0, c.stderr
    conv = {x["method"]: x for x in rows(tmp_path / "convergence.csv")}
    assert set(conv) == {"ddp", "diloco"} and all(x["time_to_target_s"] for x in conv.values())
    assert (tmp_path / "loss_vs_wall.png").stat().st_size > 0
    assert snapshot("gdtbl6") == before


HANG = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
print("up", flush=True)
while True:
    t = torch.ones(4)
    dist.all_reduce(t)
    time.sleep(0.05)
"""


def test_a_killed_rank_ends_the_launch_and_leaves_nothing(tmp_path):
    before = snapshot("gdtbl7")
    script = tmp_path / "hang_forever.py"
    script.write_text(HANG)
    p = subprocess.Popen([sys.executable, "-m", "testbed", "launch", TOPO, "--prefix", "gdtbl7", "--scale", "50",
                          "--out", str(tmp_path / "out"), "--", "python", str(script)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    victim = None
    while time.monotonic() < deadline and victim is None:
        out = subprocess.run(["ip", "netns", "pids", "gdtbl7-uscentral-h0"], capture_output=True, text=True).stdout
        for pid in out.split():
            if "hang_forever.py" in _cmd(pid):
                victim = int(pid)
        time.sleep(0.2)
    assert victim, "rank 2 never started"
    time.sleep(8)  # past init: the ranks are all-reducing over the WAN
    t_kill = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    out, err = p.communicate(timeout=90)
    assert time.monotonic() - t_kill < 20, "the launch did not notice the dead rank quickly"
    assert p.returncode == 137, (p.returncode, err[-2000:])
    assert "rank 2 (uscentral-h0, uscentral) exited with status 137 (killed by SIGKILL)" in err, err[-2000:]
    assert "Traceback" not in err
    ranks = rows(tmp_path / "out" / "ranks.csv")
    assert [x["stopped_by_launch"] for x in ranks].count("0") == 1  # the others were stopped by the launch
    left = [d for d in os.listdir("/proc") if d.isdigit() and _cmd(d).find(str(script)) >= 0]
    assert not left, "a rank outlived the launch"
    assert snapshot("gdtbl7") == before


def _cmd(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read()
    except OSError:
        return ""

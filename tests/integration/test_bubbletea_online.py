"""BubbleTea on the emulated WAN: the online service, workers serving prefill in their bubbles, and
real prefill compute whose KV caches cross the WAN to decode processes. Prefixes gdtbq1..gdtbq9."""

from __future__ import annotations

import csv
import json
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.integration.conftest import cli, command_lines, snapshot


def rows(path) -> list[dict]:
    return list(csv.DictReader(path.read_text().splitlines()))


def ours(prefix: str) -> dict[str, set[str]]:
    """What this test's prefix has on the machine (other runs on a shared machine come and go), with
    every process whose command line names it (workers, the service, decode processes)."""
    out = {k: {x for x in v if prefix in x} for k, v in snapshot().items()}
    out["procs"] |= {f"{pid} {cmd}" for pid, cmd in command_lines().items() if f"/{prefix}/" in cmd}
    return out


def test_online_bubbletea_serves_prefill_in_live_bubbles(tmp_path):
    before = ours("gdtbq3")
    r = cli("experiment", "run", str(ROOT / "experiments" / "emu-bubbletea.yaml"), "--out", str(tmp_path),
            "--set", "schedulers=[atlas, atlas+bubbletea]", "--set", "iterations=5", "--set", "emulation.prefix=gdtbq3")
    assert r.returncode == 0, r.stderr
    emu = {x["scheduler"]: x for x in rows(tmp_path / "summary.csv") if x["source"] == "emu"}
    bt, base = emu["atlas+bubbletea"], emu["atlas"]
    assert float(bt["prefill_util"]) > 0 and float(bt["gpu_util"]) > float(base["gpu_util"])
    assert -1e-9 <= float(bt["train_slowdown_p25"]) <= float(bt["train_slowdown"]) <= float(bt["train_slowdown_p75"])
    assert bt["train_slowdown_vs_alone"] != ""  # and against the separate run without BubbleTea
    reqs = [x for x in rows(tmp_path / "requests.csv") if x["source"] == "emu"]
    assert len(reqs) == int(bt["requests"]) and sum(int(x["in_bubble"]) for x in reqs) > 0
    tl = [x for x in rows(tmp_path / "timeline.csv") if x["source"] == "emu" and x["run_id"].endswith("bubbletea")]
    prefill = [x for x in tl if x["kind"] == "prefill"]
    assert prefill and min(int(x["iteration"]) for x in prefill) >= 1  # iteration 0 only teaches the windows
    assert {x["metric"] for x in rows(tmp_path / "validation.csv")} >= {"served_in_bubbles", "prefill_util"}
    assert ours("gdtbq3") == before


@pytest.mark.skipif(subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0,
                    reason="torch is not installed")
def test_real_prefill_ships_kv_caches_over_the_wan_to_decode(tmp_path):
    before = ours("gdtbq4")
    r = cli("experiment", "run", str(ROOT / "experiments" / "emu-bubbletea-torch.yaml"), "--out", str(tmp_path),
            "--set", "schedulers=[atlas+bubbletea]", "--set", "iterations=4", "--set", "bubbletea.rate_scale=2",
            "--set", "emulation.prefix=gdtbq4")
    assert r.returncode == 0, r.stderr
    served = [x for x in rows(tmp_path / "requests.csv") if x["in_bubble"] == "1"]
    assert served, "no request was prefilled in a bubble"
    for x in served:  # end to end: the KV cache reached the decode process in the home DC
        assert x["kv_ready_s"] != "" and float(x["kv_ready_s"]) >= float(x["start_s"])
    cpu = rows(tmp_path / "cpu_prefill.csv")
    assert len(cpu) >= 8 and all(float(x["measured_s"]) > 0 for x in cpu)
    assert ours("gdtbq4") == before


def test_bubbletea_service_rejects_malformed_requests(tmp_path):
    """No namespaces: the service process alone, fed junk and then a valid exchange."""
    from testbed.runtime.wire import recv_ctrl, send_ctrl

    cfg = tmp_path / "svc.json"
    sock_path, results = str(tmp_path / "svc.sock"), str(tmp_path / "res.json")
    cfg.write_text(json.dumps({
        "socket": sock_path, "results": results, "model": "llama2-7b", "layers": 32, "guard_s": 0.001, "slo_s": 2.0,
        "workers": {"s0r0": {"dc": "a", "gpu": "H100", "tp": 1, "max_tokens": 10000}},
        "kv": {"a|a": [0.0001, 1e10]}, "kv_bytes_per_token": 1000.0, "calibration": None,
        "requests": [[0, 0.0, 100, 10, "a"]]}))
    p = subprocess.Popen([sys.executable, "-m", "testbed.bubbletea.service", str(cfg)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "ready"
    try:
        for bad in ({"op": "jobs"}, {"op": "fly", "worker": "s0r0", "iteration": 0}, {"op": "done", "worker": 1}):
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock_path)
            send_ctrl(s, bad)
            assert "error" in recv_ctrl(s)
            s.close()
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock_path)
        s.sendall(b"\xff\xff\xff\xff")  # an absurd frame length
        s.close()
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock_path)
        send_ctrl(s, {"op": "jobs", "worker": "s0r0", "iteration": 0, "t_start": 100.0})
        assert recv_ctrl(s)["jobs"] == []  # nothing learnt yet
        send_ctrl(s, {"op": "idle", "worker": "s0r0", "iteration": 0, "gap": 0, "start": 100.1, "end": 100.4})
        assert recv_ctrl(s) == {"ok": True}
        send_ctrl(s, {"op": "done", "worker": "s0r0", "iteration": 0, "t_start": 100.0, "ops": 1, "overrun": 0.0,
                      "last_train_end": 100.5, "last_op_end": 100.5, "last_end": 100.5, "ran": [], "skipped": []})
        assert recv_ctrl(s) == {"ok": True}
        send_ctrl(s, {"op": "jobs", "worker": "s0r0", "iteration": 1, "t_start": 101.0})
        reply = recv_ctrl(s)  # the request arrives at iteration 1's start: planned into the learnt gap
        jobs, usable = reply["jobs"], dict(map(tuple, reply["gaps"]))
        assert [j[0] for j in jobs] == [0] and 0 < usable[0] <= 0.3 + 1e-9 and jobs[0][4] <= usable[0]
        s.close()
    finally:
        p.terminate()
        p.wait(5)
    assert json.loads((tmp_path / "res.json").read_text())["decisions"][0][:2] == [0, "s0r0"]

"""emulation.realtime on a real emulation (testbed/runtime/cpuclass.py): a delay line asked for the real-time
class runs in SCHED_RR and still delays as configured; without it, it keeps nice -10; a training run with Atlas's
sidecar (turns pinned: emu-3dc's emulated plan may leave them out) reports the class its workers and delay lines
ran in."""

from __future__ import annotations

import csv
import json
import os

from testbed.emu import state
from testbed.emu.build import down, up
from testbed.emu.check import ping
from testbed.runtime.cpuclass import LINK_PRIORITY
from testbed.spec.load import load_topology
from tests.conftest import ROOT
from tests.integration.conftest import assert_wan_rtt, cli, snapshot_of, write_topology

PREFIX = "gdtbrt"
LATENCY_MS = 5.0


def _line_pid(emu) -> int:
    (p,) = emu.delaylines.values()  # `ip netns exec` execs in place: the line's own pid
    return p.pid


def test_a_delay_line_asked_for_realtime_runs_round_robin_and_keeps_its_delay(tmp_path):
    topo = load_topology(write_topology(tmp_path / "t.yaml", latency=LATENCY_MS))
    emu = up(topo, prefix=PREFIX, scale=1, delay="nfqueue", realtime="on")
    try:
        pid = _line_pid(emu)
        assert os.sched_getscheduler(pid) & ~os.SCHED_RESET_ON_FORK == os.SCHED_RR
        assert os.sched_getparam(pid).sched_priority == LINK_PRIORITY
        assert_wan_rtt(ping(emu, "east-h0", emu.addr.host("west-h0").ip, 20), LATENCY_MS, "realtime line")
        st = json.loads((state.run_dir(PREFIX) / f"{emu.addr.wan('east', 'west').ns}.delay.json").read_text())
        assert st["cpu_class"] == "realtime"
    finally:
        down(emu)
    emu = up(topo, prefix=PREFIX, scale=1, delay="nfqueue", realtime="off")
    try:
        pid = _line_pid(emu)
        assert os.sched_getscheduler(pid) == os.SCHED_OTHER and os.getpriority(os.PRIO_PROCESS, pid) == -10
    finally:
        down(emu)
    assert not snapshot_of(PREFIX)["netns"]


def test_an_atlas_run_reports_the_class_its_processes_ran_in(tmp_path):
    r = cli("experiment", "run", str(ROOT / "experiments" / "emu-3dc.yaml"), "--out", str(tmp_path), "--set",
            "schedulers=[atlas+temporal]", "--set", "iterations=2", "--set", "emulation.delay=nfqueue", "--set",
            "emulation.realtime=on", "--prefix", PREFIX)
    assert r.returncode == 0, r.stderr
    rows = [x for x in csv.DictReader((tmp_path / "summary.csv").read_text().splitlines()) if x["source"] == "emu"]
    assert rows and all(x["cpu_class"] == "realtime" for x in rows), [x["cpu_class"] for x in rows]
    assert not snapshot_of(PREFIX)["netns"]

"""Machines with their own clocks: two local containers whose Ray (and so their agents, workers and sidecars) run in
time namespaces 500 s and 1000 s ahead of the host, where the driver runs (testbed/cluster/local.py `clocks`). Atlas
trains across them (useast and uswest on m0, uscentral on m1: both pipeline hops cross a tunnel, each split link's
halves forward ends between the two clocks). The driver must measure both offsets, the run must give an emulated
row, every transfer's receive must start at its send's start on the run's clock (the chunk's send stamp crossed
machines and came back translated), every interval must lie inside the run, and nothing may be left."""

from __future__ import annotations

import csv
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from testbed.cluster.local import LocalCluster, running, unavailable
from tests.conftest import ROOT

WHY = unavailable()
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"local cluster: {WHY}")
PREFIX = "gdtbk"
TESTBED = str(Path(sys.executable).with_name("testbed"))
CLOCKS = (500.0, 1000.0)
MEASURED = re.compile(r"clocks against the driver's: m0 ([+-][0-9.]+) s \(\+-([0-9.]+) ms\), "
                      r"m1 ([+-][0-9.]+) s \(\+-([0-9.]+) ms\)")


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    out = tmp_path_factory.mktemp("cluster-clock")
    lc = LocalCluster(PREFIX, 2, subnet="10.250.37.0/24", clocks=CLOCKS)
    with running(lc, ROOT, out):
        (out / "cluster.yaml").write_text("ray_address: auto\n")
        yield lc, out


def test_a_training_run_across_machines_with_their_own_clocks_reads_on_one_clock(machines) -> None:
    lc, out = machines
    p = lc.driver(ROOT, [TESTBED, "experiment", "run", str(ROOT / "experiments" / "emu-3dc.yaml"), "--cluster",
                         str(out / "cluster.yaml"), "--prefix", PREFIX, "--set", "schedulers=[atlas+temporal]",
                         "--set", "iterations=2", "--set", "emulation.realtime=off", "--no-probe",
                         "--out", str(out / "train")])
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    m = MEASURED.search(p.stderr)
    assert m, p.stderr[-2000:]
    print(m[0])
    for (off, unc), want in zip(((m[1], m[2]), (m[3], m[4])), CLOCKS, strict=True):
        # what each namespace was given, within the measurement's error (and the 1 ms `describe` rounds to)
        assert abs(float(off) - want) <= float(unc) / 1e3 + 0.002
    with open(out / "train" / "summary.csv") as f:
        emu = [r for r in csv.DictReader(f) if r["source"] == "emu"]
    assert len(emu) == 1 and float(emu[0]["iteration_s"]) > 0
    assert "sidecar" not in emu[0].get("degraded", ""), emu[0]["degraded"]
    with open(out / "train" / "timeline.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["source"] == "emu"]
    sends = defaultdict(list)
    for r in rows:
        assert 0 <= float(r["start_s"]) <= float(r["end_s"]) < 60, r  # untranslated: hundreds of seconds off
        if r["kind"] == "send":
            sends[(r["iteration"], r["replica"], r["microbatch"])].append((int(r["stage"]), float(r["start_s"])))
    recvs = [r for r in rows if r["kind"] == "recv"]
    assert recvs
    for r in recvs:  # its start is the sender's send time, stamped on another machine's clock
        near = [t for s, t in sends[(r["iteration"], r["replica"], r["microbatch"])] if abs(s - int(r["stage"])) == 1]
        assert any(abs(t - float(r["start_s"])) < 1e-6 for t in near), (r, near)
    assert lc.leftovers() == []

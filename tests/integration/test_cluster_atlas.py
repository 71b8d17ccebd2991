"""Atlas on a cluster of two local machines (containers with Ray: testbed/cluster/local.py): useast and uswest on
m0, uscentral on m1, so both pipeline hops cross a tunnel. Each tunnelled link runs a sidecar on each machine,
shaping the device that half sends into; the receivers' end notices cross to the other half's sidecar. The run
must give an emulated row, and every half's sidecar must have changed classes (turns handed over) and forwarded
the end of every transfer its machine's workers received, once; nothing may be left on either machine."""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import pytest

from testbed.cluster.local import LocalCluster, running, unavailable
from tests.conftest import ROOT

WHY = unavailable()
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"local cluster: {WHY}")
PREFIX = "gdtbca"
TESTBED = str(Path(sys.executable).with_name("testbed"))
HALF = re.compile(r"Atlas sidecar (\S+) on (m\d): sidecar(?: \([^)]*\))?: (\d+) class changes, \d+ rejected messages"
                  r"(?:, (\d+) end notices forwarded)?")


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    out = tmp_path_factory.mktemp("cluster-atlas")
    lc = LocalCluster(PREFIX, 2, subnet="10.250.34.0/24")
    with running(lc, ROOT, out):
        (out / "cluster.yaml").write_text("ray_address: auto\n")
        yield lc, out




def test_atlas_across_two_machines_hands_turns_over_on_both_halves_of_each_tunnel(machines) -> None:
    lc, out = machines
    p = lc.driver(ROOT, [TESTBED, "experiment", "run", str(ROOT / "experiments" / "emu-3dc.yaml"), "--cluster",
                         str(out / "cluster.yaml"), "--prefix", PREFIX, "--set", "schedulers=[atlas+temporal]",
                         "--set", "iterations=2", "--no-probe", "--out", str(out / "train")])
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    with open(out / "train" / "summary.csv") as f:
        emu = [r for r in csv.DictReader(f) if r["source"] == "emu"]
    assert len(emu) == 1 and emu[0]["scheduler"] == "atlas+temporal" and float(emu[0]["iteration_s"]) > 0
    assert "sidecar" not in emu[0].get("degraded", ""), emu[0]["degraded"]  # no worker lost its sidecar
    halves = {(m[1], m[2]): (int(m[3]), int(m[4] or 0)) for m in HALF.finditer(p.stderr)}
    for link in ("useast-uscentral", "uscentral-uswest"):  # split: a sidecar on each machine
        for machine in ("m0", "m1"):
            changes, forwarded = halves.get((link, machine), (0, 0))
            # every transfer the half's workers received ended there once: dp 2 x 8 microbatches x 2 iterations
            assert changes > 0 and forwarded == 2 * 8 * 2, (link, machine, halves, p.stderr[-3000:])
    assert lc.leftovers() == []

"""`testbed launch --scale auto --check`: a tiny DDP scale model (examples/ddp_scale.py, gloo) across the
emulated 3-DC WAN. The ranks learn k (TESTBED_SCALE) and read the link table (TESTBED_LINKS); the launch
says what k does to each link before the job starts, records k in its CSVs, and checks every WAN link
direction's transfers against the simulator's model."""

from __future__ import annotations

import csv
import json

import pytest

from tests.conftest import ROOT
from tests.integration.conftest import cli
from tests.integration.conftest import snapshot as machine_snapshot

pytest.importorskip("torch", reason="launch examples need torch (make venv installs the local CPU wheel)")
TOPO = str(ROOT / "experiments" / "emu-3dc-topology.yaml")
PREFIX = "gdtb13"


def rows(path) -> list[dict]:
    return list(csv.DictReader(path.read_text().splitlines()))


def test_a_ddp_scale_model_learns_k_and_its_transfers_are_checked(tmp_path):
    before = {k: {x for x in v if PREFIX in x} for k, v in machine_snapshot().items()}
    r = cli("launch", TOPO, "--prefix", PREFIX, "--scale", "auto", "--out", str(tmp_path), "--check", "--",
            "python", "examples/ddp_scale.py", "--real-mib", "64", "--steps", "3", "--compute-s", "0.1",
            timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    out = r.stdout
    # the scale is announced, per link, before any rank prints
    assert "--scale auto: this machine carries" in out and "x the scaled one)" in out
    first_rank_line = out.index("[r0 ")
    for link in ("useast-uscentral", "uscentral-uswest", "useast-uswest"):
        assert out.index(f"  {link}: 10 Gbit/s, window 6 MiB -> emulated") < first_rank_line
    k = float(rows(tmp_path / "ranks.csv")[0]["scale"])
    assert {float(x["scale"]) for x in rows(tmp_path / "ranks.csv")} == {k}
    # the ranks got k and the link table: the script's scale model and its model column come from them
    assert f"k={k:g} (TESTBED_SCALE)" in out
    table = json.loads((tmp_path / "links.json").read_text())
    assert table["scale"] == k and len(table["links"]) == 6
    made = rows(tmp_path / "ddp_scale.csv")
    assert {float(x["scale"]) for x in made} == {k} and all(x["model_allreduce_s"] for x in made)
    assert float(made[0]["real_bytes"]) == pytest.approx(64 * 2**20, rel=0.01)  # bytes / k, times k
    flows = rows(tmp_path / "flows.csv")
    assert flows and {float(x["scale"]) for x in flows} == {k} and all(float(x["dilation"]) > 1 for x in flows)
    # every link direction carried the DCs' exchange, and each has a checked row
    checked = {(x["link"], x["towards"]) for x in rows(tmp_path / "check.csv") if int(x["transfers"]) >= 3}
    assert len(checked) == 6, rows(tmp_path / "check.csv")
    assert "WAN transfers against the simulator's model" in out
    after = {k2: {x for x in v if PREFIX in x} for k2, v in machine_snapshot().items()}
    assert after == before

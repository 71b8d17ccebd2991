"""DiLoCo and Streaming DiLoCo on the emulated WAN: the workers run a sync period's program (inner steps inside
each DC, the outer syncs across DCs), the WAN carries the outer gradients' quantised bytes / k, and the simulator
predicts the period."""

from __future__ import annotations

import csv
from collections import Counter

from tests.conftest import ROOT
from tests.integration.conftest import cli, snapshot

EXP = str(ROOT / "experiments" / "emu-3dc.yaml")
H, ITERATIONS = 4, 3
SETS = ["schedulers=[diloco, streaming-diloco]", f"iterations={ITERATIONS}", f"workload.diloco.inner_steps={H}",
        "workload.pp=1", "workload.dp=6", "workload.global_batch=12",
        "workload.model={name: m350, layers: 24, hidden: 1024, heads: 16, vocab: 32000, seq_len: 2048}",
        "emulation.prefix=gdtb12"]


def rows(path) -> list[dict]:
    return list(csv.DictReader(path.read_text().splitlines()))


def test_diloco_runs_on_the_emulated_wan_and_sends_the_outer_gradients(tmp_path):
    before = snapshot()
    sets = [x for s in SETS for x in ("--set", s)]
    r = cli("experiment", "run", EXP, "--out", str(tmp_path), "--capture", *sets)
    assert r.returncode == 0, r.stderr
    summary = {(x["scheduler"], x["source"]): x for x in rows(tmp_path / "summary.csv")}
    assert set(summary) == {(s, src) for s in ("diloco", "streaming-diloco") for src in ("sim", "emu")}
    tl = [x for x in rows(tmp_path / "timeline.csv") if x["source"] == "emu"]
    syncs = Counter((x["run_id"].split("-", 1)[1], x["gpu"]) for x in tl if x["kind"] == "outersync")
    # every group of every DC ran each fragment's sync once per steady period (diloco: 1 fragment, streaming: 2 at
    # H = 4); the timeline keeps the periods after the first
    assert len(syncs) == 12
    assert all(n == (ITERATIONS - 1) * (1 if sched == "diloco" else 2) for (sched, _g), n in syncs.items())
    flows = rows(tmp_path / "flows.csv")
    scale = float(summary[("diloco", "emu")]["scale"])
    for sched in ("diloco", "streaming-diloco"):
        wire = sum(float(f["bytes"]) for f in flows if f["run_id"] == f"p00-{sched}")
        want = float(summary[(sched, "emu")]["wan_bytes"]) * H * ITERATIONS / scale
        # the packets' bytes on the WAN links against the programs' payload: headers add about 1 % at MTU 9000;
        # acknowledgements and control messages a little more; the bound leaves room for captured stragglers
        assert 0.97 < wire / want < 1.15, (sched, wire, want)
    for v in rows(tmp_path / "validation.csv"):
        # within 1.5 % at load 2-4 and 5 % at load 11-15 on the shared 2-core VM (docs/families.md); a ring across
        # DCs modelled as a fluid at n x W / RTT was 21 % off, which this bound catches
        if v["metric"] == "iteration_s":
            assert abs(float(v["rel_error"])) < 0.15, v
    assert snapshot() == before

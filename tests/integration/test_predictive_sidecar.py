"""The predictive Atlas sidecar on the emulated WAN: every WAN send is announced as the compute producing it starts,
and the sidecar ranks it then, ahead of its issue (testbed/runtime/announce.py, runtime/sidecar.py).

Two pipeline replicas on emu-3dc (one stage per DC) with their start offsets removed, so their transfers meet on the
WAN links, under `network.sidecar: predictive`. Each sidecar's last line counts what it heard; the test checks the
counts against the plan's programs: every WAN send of every iteration announced exactly once, none issued before its
announcement (the announcement and the issue travel one socket, in order), none repeated, none left ranked once the
run is over (every end observed), and the announcements came ahead of the issue (by a compute, less the notice's
delivery). No timing is asserted beyond that order.
"""

from __future__ import annotations

import re

from testbed.emu import state
from testbed.emu.build import down, up
from testbed.emu.train import run_training
from testbed.plan.build import resolve_dp
from testbed.plan.lower import lower
from testbed.program import Send
from testbed.runs.emulated import emulated_experiment
from testbed.sim.choose import build_plan
from testbed.spec.load import load_experiment
from tests.conftest import ROOT

PREFIX = "gdtbj1"
LINE = re.compile(r"predictive: (\d+) announced, (\d+) late, (\d+) repeated, (\d+) issued unannounced, "
                  r"(\d+) left ranked; announced ahead of the issue: median (-?[\d.]+) ms")


def test_the_predictive_sidecar_ranks_every_wan_send_at_its_announcement():
    exp = load_experiment(ROOT / "experiments" / "emu-3dc.yaml", ["iterations=3", "network.sidecar=predictive"])[0][0]
    exp = emulated_experiment(exp)
    emu = up(exp.topology, prefix=PREFIX, scale=exp.emulation.scale)
    try:
        plan = build_plan(exp, "pp-wan+mtcp+temporal", run_id="pred", dp=resolve_dp(exp), built=emu.net)
        assert plan.sidecar == "predictive"
        plan.replica_offset_s = [0.0] * plan.dp  # the replicas' transfers meet on the links
        run = run_training(plan, emu, exp.iterations)
        assert not run.degraded, run.degraded
        logs = {p.name: p.read_text() for p in state.run_dir(emu.prefix).glob("sidecar-*.log")}
    finally:
        down(emu)
    wan_sends = sum(1 for prog in lower(plan).values() for st in prog.steps
                    if isinstance(st, Send) and prog.pipe(st.peer).wan) * exp.iterations
    counts = {}
    for name, text in logs.items():
        found = LINE.findall(text)
        assert found, f"{name} has no predictive summary: {text[-400:]}"
        counts[name] = [float(x) for x in found[-1]]
    assert len(counts) == 2  # one per WAN link the pipeline crosses (both directions)
    announced, late, repeated, unannounced, left, ahead_ms = (list(c) for c in zip(*counts.values(), strict=True))
    assert sum(announced) == wan_sends, (counts, wan_sends)  # every WAN send, once
    assert sum(repeated) == 0 and sum(unannounced) == 0 and sum(left) == 0, counts
    assert all(a > 0 for a in ahead_ms), counts  # ranked before the transfer was issued
    assert sum(late) <= sum(announced) // 10, counts

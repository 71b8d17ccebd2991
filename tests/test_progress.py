"""Progress without a terminal: one line per finished step, with the elapsed time, written as it happens."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time

from rich.console import Console

from testbed.progress import Progress
from tests.conftest import ROOT

LINE = re.compile(r"^\[\s*(\d+\.\d) s\] (\d+)/(\d+) (.*)$")


def test_plain_lines_per_step_when_not_a_terminal():
    buf = io.StringIO()
    con = Console(file=buf, width=100, force_terminal=False)
    with Progress(con, 3, "work") as p:
        assert not p.terminal
        p.step("a done")
        p.line("a phase")
        p.step("b done", advance=2)
    lines = buf.getvalue().splitlines()
    assert lines[0].endswith("] work: 3 step(s)")
    assert [LINE.match(x).group(2, 4) for x in (lines[1], lines[3])] == [("1", "a done"), ("3", "b done")]
    assert lines[2].endswith("] a phase")
    assert "\x1b" not in buf.getvalue()


def test_a_simulation_piped_to_a_file_shows_progress_as_it_goes(tmp_path):
    """Each point's line reaches the pipe when that point ends, not when the run exits: the gaps between
    arrivals follow the elapsed times the lines report."""
    argv = [sys.executable, "-m", "testbed", "sim", str(ROOT / "experiments" / "tiny-3dc.yaml"), "--out",
            str(tmp_path / "o"), "--set", "workload.global_batch=4096", "--set", "schedulers=[pp-wan]",
            "--set", "timeline=none", "--sweep", "topology.links.*.latency_ms=5,10,20", "--jobs", "1"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a pipe is block-buffered by default
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    arrivals = []
    for line in p.stdout:  # type: ignore[union-attr]
        arrivals.append((time.monotonic(), line.rstrip("\n")))
    assert p.wait() == 0, p.stderr.read()  # type: ignore[union-attr]
    steps = [(t, LINE.match(x)) for t, x in arrivals if LINE.match(x)]
    assert [m.group(2, 3) for _, m in steps] == [("1", "3"), ("2", "3"), ("3", "3")]
    assert all("done: pp-wan" in m.group(4) for _, m in steps)
    reported = float(steps[-1][1].group(1)) - float(steps[0][1].group(1))
    arrived = steps[-1][0] - steps[0][0]
    assert reported > 0.2, "the points were too quick to tell"
    assert arrived >= 0.5 * reported, f"lines arrived {arrived:.2f} s apart but were printed {reported:.1f} s apart"
    assert not any("\x1b" in x for _, x in arrivals)

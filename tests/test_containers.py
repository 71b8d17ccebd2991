"""Finding a container's process from the host by the tag in its environment (no engine needed)."""

from __future__ import annotations

import os
import subprocess

from testbed.emu.containers import TAG_ENV, tagged_pids


def test_tagged_pids_finds_exactly_the_tagged_process():
    p = subprocess.Popen(["sleep", "30"], env={**os.environ, TAG_ENV: "t3st"})
    q = subprocess.Popen(["sleep", "30"], env={**os.environ, TAG_ENV: "t3stx"})
    try:
        assert tagged_pids("t3st") == [p.pid]
    finally:
        for x in (p, q):
            x.kill()
            x.wait()
    assert tagged_pids("t3st") == []

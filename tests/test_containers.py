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


class Listed:
    """What the Docker SDK lists of a container: its name and labels."""

    def __init__(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.name, self.labels = name, labels or {}


def test_ours_by_label_or_by_containernet_name_only():
    from testbed.emu.containers import LABEL, _is_ours

    assert _is_ours(Listed("gdtb1-useast-h0", {LABEL: "gdtb1"}), "gdtb1")
    assert not _is_ours(Listed("gdtb1-useast-h0", {LABEL: "gdtb1"}), "gdtb2")
    assert _is_ours(Listed("anything", {LABEL: "gdtb7"}), None)
    assert _is_ours(Listed("mn.gdtb1-useast-h0", {"com.containernet": ""}), "gdtb1")
    assert not _is_ours(Listed("mn.gdtb12-useast-h0"), "gdtb1")
    assert not _is_ours(Listed("mn.web-1"), None)  # someone else's Containernet host
    assert not _is_ours(Listed("gdtb1-useast-h0"), None)  # our name, but not our label: not ours to remove

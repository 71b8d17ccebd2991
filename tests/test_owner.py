"""Owner records per emulation prefix (files only: a temporary state directory, real processes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from testbed.emu import owner, state
from testbed.emu.sh import EmuError
from tests.conftest import ROOT

HOLD = ("import sys, time; from testbed.emu import owner; owner.claim(sys.argv[1]); print('held', flush=True); "
        "time.sleep(60)")


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(state, "STATE_DIR", tmp_path)
    return tmp_path


def holder(prefix: str, state_dir) -> subprocess.Popen:
    """Another process that owns `prefix` (until killed)."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, prefix], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "GDTB_STATE_DIR": str(state_dir)})
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_live_owner_is_refused_and_a_dead_one_is_replaced(state_dir):
    p = holder("gdtbo7", state_dir)
    try:
        assert owner.alive(owner.read("gdtbo7")) and not owner.is_mine(owner.read("gdtbo7"))
        with pytest.raises(EmuError, match=f"in use by pid {p.pid}"):
            owner.claim("gdtbo7")
        assert "owned by" in owner.in_use("gdtbo7")
    finally:
        p.kill()
        p.wait()
    assert not owner.alive(owner.read("gdtbo7"))  # same pid record, process gone
    assert owner.claim("gdtbo7") is True and owner.is_mine(owner.read("gdtbo7"))
    assert owner.claim("gdtbo7") is False  # already ours
    owner.release("gdtbo7")
    assert owner.read("gdtbo7") is None


def test_a_recycled_pid_is_not_a_live_owner(state_dir):
    rec = owner.me()
    assert owner.alive(rec)
    assert not owner.alive({**rec, "start": rec["start"] - 1})  # our pid, another process's start time


def test_a_topology_left_up_is_never_adopted(state_dir):
    state.save("gdtbo8", {"prefix": "gdtbo8"})
    with pytest.raises(EmuError, match="already up"):
        owner.claim("gdtbo8")
    assert owner.read("gdtbo8") is None


def test_the_free_prefix_skips_owners_records_state_and_namespaces(state_dir):
    p = holder("gdtb1", state_dir)  # (only files in a temporary directory: no real prefix is touched)
    try:
        state.save("gdtb2", {"prefix": "gdtb2"})
        (state_dir / "gdtb3.owner").write_text('{"pid": 1, "start": -1, "cmd": "gone", "since": 0}')
        picked = owner.pick_free({"gdtb4-useast-h0"})
        assert picked == "gdtb5" and owner.is_mine(owner.read("gdtb5"))
        assert owner.pick_free({"gdtb4-useast-h0"}) == "gdtb6"  # gdtb5 is held now
        with owner.owned("gdtbo9") as held:
            assert held == "gdtbo9" and owner.is_mine(owner.read("gdtbo9"))
        assert owner.read("gdtbo9") is None
    finally:
        p.kill()
        p.wait()

"""Chaos with nothing lost: parts of an emulated run killed (SIGKILL) at a random point. Each case ends with a
one-line error or a degraded row naming what failed, results/ holds whole CSVs or none, and nothing of the
prefix is left once the run (or `testbed clean --prefix`, after a killed orchestrator) is over; a WAN link taken
down for longer than the workers' TCP user timeout ends the run with one line naming the link. A killed worker
and a killed Atlas sidecar are tested in test_training_emulation.py."""

from __future__ import annotations

import contextlib
import csv
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.emu import state
from tests.conftest import ROOT
from tests.integration.conftest import cli, snapshot_of

EMPTY = {"netns": set(), "links": set(), "iptables": set(), "procs": set()}


def _pids(module: str, prefix: str) -> list[int]:
    """Processes running `module` for `prefix` (their arguments name the prefix's state folder)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if module in cmd and str(state.STATE_DIR / prefix) in cmd:
            out.append(int(d.name))
    return out


def _start(tmp_path: Path, prefix: str, exp: str, *sets: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "testbed", "experiment", "run", str(ROOT / "experiments" / exp), "--out",
            str(tmp_path), "--prefix", prefix, "--no-probe", *(x for s in sets for x in ("--set", s))]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_when_running(prefix: str, module: str, rng: random.Random, timeout_s: float = 60) -> None:
    """SIGKILL `module`'s first process of `prefix` at a random point once the workers have started."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if list((state.STATE_DIR / prefix).glob("worker-*.json")) and (pids := _pids(module, prefix)):
            time.sleep(rng.uniform(0.3, 1.5))
            os.kill(pids[0], signal.SIGKILL)
            return
        time.sleep(0.05)
    pytest.skip(f"no {module} process in this run (netem delays the links here)"
                if "delayline" in module else f"no {module} process")


def _rng() -> random.Random:
    """The random kill point: CHAOS_SEED replays one."""
    return random.Random(int(os.environ.get("CHAOS_SEED", time.time_ns() % 10**6)))


@contextlib.contextmanager
def _running(tmp_path: Path, prefix: str, exp: str, *sets: str):
    """An experiment run in the background; killed on the way out if the test's fault did not end it."""
    p = _start(tmp_path, prefix, exp, *sets)
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()


def _whole_or_none(out: Path) -> None:
    """Every CSV in `out` parses whole (a header and rows of its width); no temporary file is left."""
    assert not list(out.glob(".*.tmp")), "a half-written file"
    for f in out.glob("*.csv"):
        rows = list(csv.reader(f.read_text().splitlines()))
        assert rows and all(len(r) == len(rows[0]) for r in rows), f


def test_a_killed_delay_line_ends_the_run_with_one_line_naming_it(tmp_path):
    with _running(tmp_path, "gdtbcd", "emu-3dc.yaml", "schedulers=[pp-wan]", "iterations=40") as p:
        _kill_when_running("gdtbcd", "testbed.emu.delayline", _rng())
        _out, err = p.communicate(timeout=60)
    lines = [ln for ln in err.splitlines() if ln.startswith("emulation error:")]
    assert p.returncode == 1 and len(lines) == 1 and "delay line" in lines[0] and "died" in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "summary.csv").exists()
    _whole_or_none(tmp_path)
    assert snapshot_of("gdtbcd") == EMPTY


def test_a_killed_bubbletea_service_leaves_a_degraded_row_naming_it(tmp_path):
    with _running(tmp_path, "gdtbcb", "emu-bubbletea.yaml", "schedulers=[atlas+bubbletea]", "iterations=5") as p:
        _kill_when_running("gdtbcb", "testbed.bubbletea.service", _rng())
        _out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    emu = [r for r in csv.DictReader((tmp_path / "summary.csv").read_text().splitlines()) if r["source"] == "emu"]
    assert len(emu) == 1 and "BubbleTea service" in emu[0]["degraded"], emu
    assert "degraded" in err and "BubbleTea service" in err
    _whole_or_none(tmp_path)
    assert snapshot_of("gdtbcb") == EMPTY


def test_a_killed_orchestrator_leaves_nothing_after_clean(tmp_path):
    with _running(tmp_path, "gdtbco", "emu-3dc.yaml", "schedulers=[atlas+temporal]", "iterations=40") as p:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list((state.STATE_DIR / "gdtbco").glob("worker-*.json")):
            time.sleep(0.05)
        time.sleep(_rng().uniform(0.3, 1.5))
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    assert snapshot_of("gdtbco") != EMPTY, "the killed run left its network (nothing else could remove it)"
    r = cli("clean", "--prefix", "gdtbco")
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 10  # workers whose orchestrator died exit on their own once its socket closes
    while time.monotonic() < deadline and snapshot_of("gdtbco") != EMPTY:
        time.sleep(0.2)
    assert snapshot_of("gdtbco") == EMPTY
    assert not (tmp_path / "summary.csv").exists()
    _whole_or_none(tmp_path)


def _connected(prefix: str) -> bool:
    """Whether the workers have connected across the WAN: an established TCP connection between hosts of two
    DCs (10.80.<dc>.<host>, emu/names.py)."""
    hosts = sorted(ns for ns in snapshot_of(prefix)["netns"] if "-h" in ns.removeprefix(prefix))
    for ns in hosts:
        r = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Htn", "state", "established"], capture_output=True,
                           text=True)
        ends = [[e.rsplit(":", 1)[0].split(".") for e in ln.split()[-2:]] for ln in r.stdout.splitlines()]
        if any(len(a) == len(b) == 4 and a[:2] == b[:2] == ["10", "80"] and a[2] != b[2] for a, b in ends):
            return True
    return False


def _forwarded_bytes(ns: str) -> int:
    """Bytes the WAN link's namespace has sent on its interfaces (both directions)."""
    text = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/dev"], capture_output=True, text=True).stdout
    return sum(int(ln.split(":")[1].split()[8]) for ln in text.splitlines()[2:] if ":" in ln)


def _wan_down_when_running(prefix: str, rng: random.Random, timeout_s: float = 60) -> str:
    """Cut one WAN link the run uses (every packet it would forward dropped, silently, as a severed fibre) at a
    random point once the workers have connected; returns the link's namespace."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not _connected(prefix):
        time.sleep(0.1)
    time.sleep(1.0 + rng.uniform(0.3, 1.5))  # past the set-up: into the iterations
    wans = sorted(ns for ns in snapshot_of(prefix)["netns"] if f"{prefix}-wan-" in ns)
    used = [ns for ns in wans if _forwarded_bytes(ns) > 2**20]
    assert used, wans
    ns = rng.choice(used)
    subprocess.run(["ip", "netns", "exec", ns, "iptables", "-I", "FORWARD", "1", "-j", "DROP"], check=True)
    return ns


def test_a_wan_link_down_past_the_tcp_user_timeout_ends_the_run_with_one_line_naming_it(tmp_path):
    with _running(tmp_path, "gdtbcw", "emu-3dc.yaml", "schedulers=[pp-wan]", "iterations=40",
               "network.tcp_user_timeout_s=2") as p:
        ns = _wan_down_when_running("gdtbcw", _rng())
        _out, err = p.communicate(timeout=90)
    a, b = ns.removeprefix("gdtbcw-wan-").split("-")
    lines = [ln for ln in err.splitlines() if ln.startswith("emulation error:")]
    assert p.returncode == 1 and len(lines) == 1, err
    assert f"WAN link {a}-{b}" in lines[0] or f"WAN link {b}-{a}" in lines[0], lines[0]
    assert "nothing acknowledged for 2 s" in lines[0], lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "summary.csv").exists()
    _whole_or_none(tmp_path)
    assert snapshot_of("gdtbcw") == EMPTY


def test_a_full_results_disk_ends_the_run_with_one_line_and_only_whole_files(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(disk)], check=True)
    try:
        p = _start(disk, "gdtbcf", "emu-3dc.yaml", "schedulers=[pp-wan]", "iterations=2")
        _out, err = p.communicate(timeout=120)
        lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert p.returncode == 2 and len(lines) == 1, err
        assert "no space left on device" in lines[0] and "--out" in lines[0], lines[0]
        assert "Traceback" not in err
        _whole_or_none(disk)
        assert not [f for f in disk.iterdir() if f.name.startswith(".")], "a temporary file left on the full disk"
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    assert snapshot_of("gdtbcf") == EMPTY

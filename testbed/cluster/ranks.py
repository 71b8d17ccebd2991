"""One machine's ranks of `testbed launch --cluster` (run by its agent, testbed/cluster/machine.py): each started in
its emulated host's namespace exactly as a single-machine launch starts it (testbed.launch.run.RankProcess: the
tag in its environment finds everything it starts), its output lines and exit status kept until the driver drains
them (testbed/cluster/launch.py polls every machine), and all of them stopped with the launch's grace period.

The user's script reaches the machine as files (`Carried`): one whose same path here holds the same bytes runs
in place (a checkout every machine shares: the script's own imports beside it work), any other is written under
the launch's directory here, with the files beside it that came with it, and its argument rewritten to it.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.launch.ranks import Slot
from testbed.launch.run import RankProcess, exit_code, resolve_command, stop_all

MAX_LINES_PER_DRAIN = 5000  # one drain's reply stays small; the rest waits for the next poll
PUMP_JOIN_S = 1.0


@dataclass(frozen=True)
class Carried:
    """The file named by argument `index` of the command, and the files beside it sent with it (name -> bytes)."""

    index: int
    path: str  # absolute, on the driver's machine
    files: dict[str, bytes]


def place(carried: list[Carried], argv: list[str], launch_dir: Path) -> tuple[list[str], list[str]]:
    """`argv` with each carried file's argument pointing at a copy of it here, unless the same path here holds the
    same bytes; and a line per file copied."""
    argv, notes = list(argv), []
    for c in carried:
        here = Path(c.path)
        main = c.files[here.name]
        if here.is_file() and here.read_bytes() == main:
            continue
        d = launch_dir / f"arg{c.index}"
        d.mkdir(parents=True, exist_ok=True)
        for name, data in c.files.items():
            (d / name).write_bytes(data)
        argv[c.index] = str(d / here.name)
        notes.append(f"{c.path} -> {argv[c.index]} ({len(c.files)} file(s))")
    return argv, notes


def outputs(out_dir: Path, since_s: float, marker: str, max_bytes: int) -> tuple[dict[str, bytes], list[str]]:
    """What the ranks wrote under `out_dir` here: each file modified since `since_s` (wall clock), by its path
    relative to `out_dir`, up to `max_bytes` in all (the rest named, left here); nothing when the folder is the
    driver's own (shared: its `marker` file is visible here)."""
    if not out_dir.is_dir() or (out_dir / marker).exists():
        return {}, []
    files, left, total = {}, [], 0
    for p in sorted(out_dir.rglob("*")):
        if not p.is_file() or p.stat().st_mtime < since_s:
            continue
        size = p.stat().st_size
        if total + size > max_bytes:
            left.append(str(p))
            continue
        files[str(p.relative_to(out_dir))] = p.read_bytes()
        total += size
    return files, left


def rank_environ() -> dict[str, str]:
    """The agent's environment without Ray's own settings (a rank is not a Ray worker)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "CUDA_VISIBLE_DEVICES"}


class RankHost:
    """The ranks of one launch on this machine."""

    def __init__(self, emu, launch_dir: Path) -> None:
        self.emu, self.launch_dir = emu, launch_dir
        self.procs: list[RankProcess] = []
        self.lines: list[tuple[int, str]] = []
        self.exits: list[tuple[int, int, float]] = []  # (rank, exit code, wall_s), not yet drained
        self.reported: set[int] = set()
        self.lock = threading.Lock()
        self.started_s = 0.0

    def start(self, slots: list[Slot], argv: list[str], envs: dict[int, dict[str, str]], cwd: str,
              carried: list[Carried]) -> list[str]:
        """Start every slot's rank; returns the lines saying which files were copied here."""
        self.started_s = time.time()  # wall clock, as files' modification times
        argv, notes = place(carried, resolve_command(argv, in_container=False), self.launch_dir)
        if not Path(cwd).is_dir():
            self.launch_dir.mkdir(parents=True, exist_ok=True)
            notes.append(f"no folder {cwd} here: the ranks run in {self.launch_dir}")
            cwd = str(self.launch_dir)
        base = rank_environ()
        for s in slots:
            Path(envs[s.rank]["TESTBED_OUT"]).mkdir(parents=True, exist_ok=True)
            p = RankProcess(self.emu, s, argv, envs[s.rank], cwd, base_env=base)
            self.procs.append(p)
            pump = threading.Thread(target=self._pump, args=(p,), daemon=True)
            pump.start()
            threading.Thread(target=self._wait, args=(p, pump), daemon=True).start()
        return notes

    def _pump(self, p: RankProcess) -> None:
        for raw in iter(p.p.stdout.readline, b""):  # type: ignore[union-attr]
            with self.lock:
                self.lines.append((p.slot.rank, raw.decode(errors="replace").rstrip("\n")))

    def _wait(self, p: RankProcess, pump: threading.Thread) -> None:
        """The rank's exit, recorded after its last lines (unless a child it left keeps its output open)."""
        rc = p.p.wait()
        pump.join(PUMP_JOIN_S)
        with self.lock:
            self.exits.append((p.slot.rank, exit_code(rc), time.monotonic() - p.t0))

    def drain(self) -> tuple[list[tuple[int, str]], list[tuple[int, int, float]]]:
        """The output lines and exits since the last drain (a rank's exit only once its lines are all out)."""
        with self.lock:
            lines, self.lines = self.lines[:MAX_LINES_PER_DRAIN], self.lines[MAX_LINES_PER_DRAIN:]
            if self.lines:
                return lines, []
            exits, self.exits = self.exits, []
        self.reported.update(r for r, _, _ in exits)
        return lines, exits

    def stop(self, grace_s: float) -> tuple[list[tuple[int, str]], list[tuple[int, int, float]]]:
        """Stop every rank still running (SIGTERM, SIGKILL after `grace_s`); every line and exit not yet drained,
        each rank stopped here counted (its exit code is the signal's)."""
        stop_all(self.procs, grace_s)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.reported) + len(self.exits) >= len(self.procs):
                    break
            time.sleep(0.02)
        time.sleep(0.1)  # the pumps' last lines
        with self.lock:
            lines, self.lines = self.lines, []
            exits, self.exits = self.exits, []
        return lines, exits

    def close(self) -> None:
        stop_all(self.procs, 0.5)
        self.procs.clear()
        shutil.rmtree(self.launch_dir, ignore_errors=True)

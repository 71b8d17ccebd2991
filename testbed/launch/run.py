"""`testbed launch`: a foreign torch.distributed job on the emulated WAN, one rank set per emulated host.

Every rank is started inside its emulated host (bare namespace, or the host's container in the
worker image), with torchrun's environment on the emulated network (`ranks.rank_env`). Each rank's
output is printed line by line behind `[r<rank> <host>]`. When a rank fails, the others are stopped
(SIGTERM, then SIGKILL after a grace period) and the launch returns that rank's exit status. Every
process a rank starts inherits a tag in its environment, so stopping reaches its children too, and
also works through `docker exec` (whose client does not forward signals).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from testbed.emu import containers
from testbed.emu.build import Emulation
from testbed.launch.ranks import Slot, layout, omp_threads, rank_env

GRACE_S = 3.0
RANKS_HEADER = ("rank", "host", "dc", "replica", "exit_code", "wall_s", "stopped_by_launch", "scale",
                "wan_dilation_max")
PYTHONS = ("python", "python3")


@dataclass
class RankExit:
    slot: Slot
    code: int  # the shell's convention: 128 + N when killed by signal N
    wall_s: float
    stopped: bool  # stopped by the launcher after another rank failed (or on Ctrl-C)


@dataclass
class LaunchResult:
    exits: list[RankExit]
    failed: RankExit | None  # the first rank that failed on its own
    flows: list[tuple] = field(default_factory=list)  # flows.csv rows when captured
    capture_summary: str = ""

    @property
    def code(self) -> int:
        return self.failed.code if self.failed else max((e.code for e in self.exits), default=0)


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def describe(code: int) -> str:
    if code > 128 and code - 128 < signal.NSIG:
        with contextlib.suppress(ValueError):
            return f"status {code} (killed by {signal.Signals(code - 128).name})"
    return f"status {code}"


def resolve_command(argv: list[str], in_container: bool) -> list[str]:
    """`python` means the interpreter with torch and the testbed: this one on bare namespaces (as
    torchrun runs a script with its own interpreter), the image's venv in containers."""
    if argv and argv[0] in PYTHONS:
        return [containers.PYTHON if in_container else sys.executable, *argv[1:]]
    return argv


class RankProcess:
    """One rank: its process handle and the tag that finds everything it started."""

    def __init__(self, emu: Emulation, slot: Slot, argv: list[str], env: dict[str, str], cwd: str,
                 base_env: dict[str, str] | None = None) -> None:
        """`env` on top of `base_env` (default: this process's environment)."""
        self.slot, self.t0 = slot, time.monotonic()
        node = emu.node(slot.ns)
        kw = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL,
              "start_new_session": True}
        if "container" in node.extra:  # docker exec: the worker image, as its user, in the host's container
            flags = [f for k, v in env.items() for f in ("-e", f"{k}={v}")]
            self.p: subprocess.Popen = containers.ContainerProcess(
                ["docker", "exec", "-w", cwd, *flags, node.extra["container"], *argv], **kw)
            self.tag = self.p.tag  # type: ignore[attr-defined]
        else:
            self.tag = uuid.uuid4().hex[:16]
            base = os.environ if base_env is None else base_env
            self.p = emu.backend.popen(node, argv, env={**base, **env, containers.TAG_ENV: self.tag}, cwd=cwd, **kw)

    def signal(self, sig: int) -> None:
        for pid in containers.tagged_pids(self.tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        with contextlib.suppress(ProcessLookupError):
            subprocess.Popen.send_signal(self.p, sig)

    def alive(self) -> bool:
        return self.p.poll() is None or bool(containers.tagged_pids(self.tag))


def stop_all(procs: list[RankProcess], grace_s: float = GRACE_S) -> None:
    """SIGTERM everything still running, SIGKILL what outlives the grace period, and wait."""
    live = [p for p in procs if p.alive()]
    for p in live:
        p.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [p for p in live if p.alive()]
    for p in live:
        p.signal(signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.p.wait(5)


def _pump(proc: RankProcess, say: Callable[[str], None]) -> None:
    prefix = f"[r{proc.slot.rank} {proc.slot.host}] "
    for raw in iter(proc.p.stdout.readline, b""):  # type: ignore[union-attr]
        say(prefix + raw.decode(errors="replace").rstrip("\n"))


def run_job(emu: Emulation, argv: list[str], *, nproc: int = 1, master_port: int = 29500, connections: int = 1,
            out_dir: Path, cwd: str, echo: Callable[[str], None] = print, capture=None,
            on_failure: Callable[[str], None] | None = None, links_file: str = "") -> LaunchResult:
    """Start every rank, stream their output, stop the rest when one fails; always leaves no rank behind.
    `capture` (a started testbed.emu.capture.Capture) is stopped once the ranks are done."""
    slots = layout(emu.addr, nproc)
    in_container = any("container" in emu.node(s.ns).extra for s in slots)
    gpus = containers.gpu_ids()
    dcs = [d.name for d in emu.topo.dcs]
    threads = omp_threads(os.cpu_count() or 1, len(slots))
    argv = resolve_command(argv, in_container)
    out_dir.mkdir(parents=True, exist_ok=True)
    if emu.backend.service_uid is not None:  # ranks in containers run as the image's user
        os.chmod(out_dir, 0o777)
    procs: list[RankProcess] = []
    exits: queue.Queue[tuple[RankProcess, int]] = queue.Queue()
    results: dict[int, RankExit] = {}
    failed: RankExit | None = None
    lock = threading.Lock()

    log = open(out_dir / "launch.log", "w")  # noqa: SIM115 (closed below, after the pumps)

    def say(line: str) -> None:
        with lock:
            echo(line)
            if not log.closed:
                log.write(line + "\n")
    pumps = []
    try:
        for s in slots:
            env = rank_env(s, slots, master_port=master_port, connections=connections, dcs=dcs, gpus=gpus,
                           in_container=in_container, out_dir=str(out_dir.resolve()), threads=threads,
                           scale=emu.scale, links_file=links_file)
            proc = RankProcess(emu, s, argv, env, cwd)
            procs.append(proc)
            pumps.append(threading.Thread(target=_pump, args=(proc, say), daemon=True))
            pumps[-1].start()
            threading.Thread(target=lambda p=proc: exits.put((p, p.p.wait())), daemon=True).start()
        pending = {p.slot.rank for p in procs}
        while pending:
            try:
                proc, rc = exits.get(timeout=0.25)
            except queue.Empty:
                continue
            pending.discard(proc.slot.rank)
            results[proc.slot.rank] = RankExit(proc.slot, exit_code(rc), time.monotonic() - proc.t0, False)
            if rc != 0:
                failed = results[proc.slot.rank]
                msg = (f"rank {proc.slot.rank} ({proc.slot.host}, {proc.slot.dc}) exited with {describe(failed.code)}; "
                       f"stopping the other {len(pending)} rank(s)")
                (on_failure or say)(msg)
                break
    finally:
        stop_all(procs)
        for p in procs:
            if p.slot.rank not in results:
                rc = p.p.poll()
                results[p.slot.rank] = RankExit(p.slot, exit_code(rc if rc is not None else -signal.SIGKILL),
                                                time.monotonic() - p.t0, True)
        for t in pumps:
            t.join(2)
        log.close()
        cap = capture.stop() if capture is not None else None
    res = LaunchResult([results[s.rank] for s in slots], failed)
    if cap is not None:
        res.flows, res.capture_summary = launch_flows(emu, slots, cap), cap.summary()
    return res


def launch_flows(emu: Emulation, slots: list[Slot], cap) -> list[tuple]:
    """flows.csv rows of a launch: each address is an emulated host, its replica the host's index in its
    DC, its ranks those the host runs."""
    from testbed.emu.capture import host_flows

    ranks: dict[str, str] = {}
    for s in slots:
        ranks[s.ip] = f"{ranks[s.ip]}|{s.rank}" if s.ip in ranks else str(s.rank)
    return host_flows(emu, cap, ranks, run_id="launch")

"""The agent on each machine of a cluster (a Ray actor started there as root): builds and tears down the
machine's part of the emulation with the single-machine code, runs commands in its namespaces for the driver, and
cleans its leftovers. Plain Python: Ray only places it (testbed/cluster/driver.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from testbed.cluster.part import builder
from testbed.cluster.placement import Part
from testbed.emu.sh import EmuError
from testbed.spec.topology import Topology


def code_fingerprint() -> str:
    """A hash of the testbed package's source here: every machine must build with the same code."""
    import hashlib
    from pathlib import Path

    import testbed

    h = hashlib.sha256()
    root = Path(testbed.__file__).parent
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


class MachineAgent:
    def __init__(self, name: str, driver_python: str) -> None:
        self.name = name
        self.driver_python = driver_python  # role commands name the driver's interpreter: this machine runs its own
        self.emu = None
        self.procs: dict[int, subprocess.Popen] = {}
        self.logs: dict[int, str] = {}  # pid -> its log: the Atlas sidecars
        self.side_relays: list = []  # the sidecars' relays between the halves of split links
        self.ranks = None  # a launch's ranks here (testbed/cluster/ranks.py RankHost)

    def info(self) -> dict:
        return {"name": self.name, "euid": os.geteuid(), "hostname": socket.gethostname(), "pid": os.getpid(),
                "code": code_fingerprint()}

    def up(self, topo_json: dict, part: Part, prefix: str, scale: float, delay: str, vxlan_port: int,
           kw: dict | None = None) -> dict:
        from testbed.emu.build import up
        from testbed.emu.kernel import require_root

        require_root()
        topo = Topology.model_validate(topo_json)
        self.emu = up(topo, prefix=prefix, scale=scale, delay=delay, builder=builder(part, vxlan_port), **(kw or {}))
        return {"delay": self.emu.delay, "notes": self.emu.notes}

    def down(self) -> None:
        from testbed.emu.build import down

        self.close_ranks()
        self.close_relay()
        self.close_side_relays()
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        self.procs.clear()
        if self.emu is not None:
            emu, self.emu = self.emu, None
            down(emu)

    def _argv(self, ns: str, argv: list[str]) -> list[str]:
        argv = [sys.executable if a == self.driver_python else a for a in argv]
        if ns not in self._namespaces():
            raise EmuError(f"machine {self.name}: no namespace {ns} here")
        return ["ip", "netns", "exec", ns, *argv]

    def _namespaces(self) -> set[str]:
        return set(self.emu.backend.nodes) if self.emu is not None else set()

    def run(self, ns: str, argv: list[str], check: bool = True, timeout: float | None = None) -> str:
        from testbed.emu.sh import run

        return run(self._argv(ns, argv), check=check, **({"timeout": timeout} if timeout else {}))

    def spawn(self, ns: str, module: str, args: list[str], files: dict[str, str]) -> int:
        """A role process (`python -m module args`) in namespace `ns`, its files (path -> text: configs the
        driver wrote) written here first; stdout discarded, stderr kept for `status`."""
        from pathlib import Path

        for path, text in files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
        p = subprocess.Popen(self._argv(ns, [sys.executable, "-m", module, *args]), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.procs[p.pid] = p
        return p.pid

    def spawn_sidecar(self, ns: str, cfg: dict, cfg_path: str, gid: int) -> int:
        """An Atlas sidecar (testbed/runtime/sidecar.py) in namespace `ns`, its configuration written here and
        its stderr to a log beside it; returns once it listens, its socket given to the run's group."""
        from pathlib import Path

        from testbed.runtime.access import grant

        Path(cfg_path).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg_path).write_text(json.dumps(cfg))
        log_path = str(Path(cfg_path).with_suffix(".log"))
        with open(log_path, "w") as log:
            p = subprocess.Popen(self._argv(ns, [sys.executable, "-m", "testbed.runtime.sidecar", cfg_path]),
                                 stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        self.procs[p.pid] = p
        self.logs[p.pid] = log_path
        if p.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            raise EmuError(f"machine {self.name}: the Atlas sidecar in {ns} did not start: {self.stderr(p.pid)}")
        grant(cfg["socket"], gid)
        return p.pid

    def sidecar_inbox(self, sock_path: str, bind_ip: str, peer: str, peer_ip: str, secret: str) -> tuple[str, int]:
        """Listen on `bind_ip` for machine `peer`'s forwarded end notices (its half of a split link), each
        connection carried to this half's sidecar at `sock_path`; returns the address to give `peer`."""
        from testbed.cluster.relay import DriverRelay, to_unix

        inbox = DriverRelay(bind_ip, {peer: peer_ip}, secret, to_unix(sock_path))
        self.side_relays.append(inbox)
        return tuple(inbox.address)

    def sidecar_outbox(self, fwd_path: str, inbox: tuple[str, int], secret: str) -> None:
        """Carry this machine's sidecars' forwarded notices (at `fwd_path`) to the other half's inbox."""
        from testbed.cluster.relay import AgentRelay

        self.side_relays.append(AgentRelay(fwd_path, self.name, tuple(inbox), secret, lambda: set(self.logs)))

    def close_side_relays(self) -> None:
        """The relays between split links' sidecars: closed when a run's sidecars stop."""
        for r in self.side_relays:
            r.close()
        self.side_relays = []

    def stderr(self, pid: int) -> str:
        p = self.procs.get(pid)
        if pid in self.logs:
            from pathlib import Path

            return Path(self.logs[pid]).read_text() if p is None or p.poll() is not None else ""
        return p.stderr.read() if p is not None and p.stderr and p.poll() is not None else ""

    def relay(self, path: str, driver: tuple[str, int], secret: str) -> None:
        """Carry this machine's workers' control connections (at `path`) to the driver (testbed/cluster/relay.py)."""
        from testbed.cluster.relay import AgentRelay

        self.close_relay()
        self.relays = [AgentRelay(path, self.name, driver, secret, lambda: set(self.procs))]

    def close_relay(self) -> None:
        for r in getattr(self, "relays", []):
            r.close()
        self.relays = []

    def delay_stats(self) -> dict[str, dict]:
        """WAN namespace -> its delay line's stats (poked to write them now: testbed/emu/health.py)."""
        import time

        from testbed.emu import state
        from testbed.emu.build import delay_control
        from testbed.emu.health import POKE_WAIT_S, delay_stats, poke

        if self.emu is None or not self.emu.delaylines:
            return {}
        for ns in self.emu.delaylines:
            poke(delay_control(self.emu, ns))
        time.sleep(POKE_WAIT_S)
        return {ns: delay_stats(str(state.run_dir(self.emu.prefix) / f"{ns}.delay.json")) for ns in self.emu.delaylines}

    def clock(self) -> float:
        """CLOCK_MONOTONIC here: the driver compares it with its own (one clock for the whole run)."""
        import time

        return time.monotonic()

    def popen(self, ns: str, argv: list[str]) -> int:
        p = subprocess.Popen(self._argv(ns, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs[p.pid] = p
        return p.pid

    def communicate(self, pid: int, timeout: float | None) -> tuple[str, str, int]:
        """The process's output and exit status; raises subprocess.TimeoutExpired if it runs past `timeout`."""
        out, err = self.procs[pid].communicate(timeout=timeout)
        err = self.stderr(pid) if pid in self.logs else err
        rc = self.procs.pop(pid).returncode
        return out, err, rc

    def poll(self, pid: int) -> int | None:
        return self.procs[pid].poll() if pid in self.procs else 0

    def terminate(self, pid: int) -> None:
        p = self.procs.get(pid)
        if p is not None and p.poll() is None:
            p.terminate()

    def kill(self, pid: int) -> None:
        p = self.procs.pop(pid, None)
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()

    def launch_resources(self) -> dict:
        """What this machine's ranks of a launch share: its cores and its GPUs (nvidia-smi's indices)."""
        from testbed.emu.containers import gpu_ids

        return {"cpus": os.cpu_count() or 1, "gpus": gpu_ids()}

    def start_ranks(self, slots: list, argv: list[str], envs: dict[int, dict[str, str]], cwd: str, carried: list,
                    files: dict[str, bytes]) -> list[str]:
        """A launch's ranks on this machine (testbed/cluster/ranks.py), `files` (path -> bytes: the launch's link
        table) written first where this machine does not already hold them; returns the lines on files copied."""
        from pathlib import Path

        from testbed.cluster.ranks import RankHost
        from testbed.emu import state

        if self.emu is None:
            raise EmuError(f"machine {self.name}: no emulation is up here to launch ranks in")
        self.close_ranks()
        for path, data in files.items():
            p = Path(path)
            if not (p.is_file() and p.read_bytes() == data):
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
        self.ranks = RankHost(self.emu, state.run_dir(self.emu.prefix) / "launch")
        return self.ranks.start(slots, argv, envs, cwd, carried)

    def rank_events(self) -> tuple[list, list]:
        """The ranks' output lines and exits since the last call."""
        return self.ranks.drain() if self.ranks is not None else ([], [])

    def stop_ranks(self, grace_s: float) -> tuple[list, list]:
        """Stop every rank still running; the lines and exits not yet given."""
        return self.ranks.stop(grace_s) if self.ranks is not None else ([], [])

    def rank_outputs(self, out_dir: str, marker: str, max_bytes: int) -> tuple[dict[str, bytes], list[str]]:
        """The files the ranks wrote under `out_dir` here, unless the driver shares the folder
        (testbed/cluster/ranks.py `outputs`)."""
        from pathlib import Path

        from testbed.cluster.ranks import outputs

        if self.ranks is None:
            return {}, []
        return outputs(Path(out_dir), self.ranks.started_s, marker, max_bytes)

    def close_ranks(self) -> None:
        """No rank left, nor the files carried for them."""
        if self.ranks is not None:
            ranks, self.ranks = self.ranks, None
            ranks.close()

    def clean(self, prefix: str | None, force: bool) -> list[str]:
        from testbed.emu.clean import clean
        from testbed.emu.kernel import require_root

        require_root()
        return clean(prefix, force=force)

    def leftovers(self, prefix: str) -> list[str]:
        """What of `prefix` exists on this machine: namespaces, interfaces in its own namespace, state."""
        from testbed.emu.clean import our_root_links
        from testbed.emu.owner import our_namespaces
        from testbed.emu.state import state_path

        found = [f"netns {n}" for n in our_namespaces(prefix)] + [f"link {n}" for n in our_root_links(prefix)]
        return found + ([f"state {prefix}"] if state_path(prefix).exists() else [])

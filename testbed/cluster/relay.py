"""The workers' control plane across machines. On a machine other than the driver's, the agent listens on the
run's control socket path, as the driver's Controller does on its own (testbed/emu/train.py): it accepts only a
process it started (SO_PEERCRED's pid) running as root, then carries its bytes over one TCP connection to the
driver, which opens with a line naming the run's secret, the machine and the worker's pid. The driver accepts a
connection only from that machine's address with that secret, and hands it to the Controller as the process the
agent vouched for.

A WAN link split between two machines runs an Atlas sidecar on each half (testbed/runtime/sidecar.py): the
agent that holds a half listens on the cluster network as the driver does (`DriverRelay`, only the other half's
machine with the link's secret) and hands each connection to its sidecar's socket (`to_unix`); the other agent
carries its own sidecar's forwarded end notices there (`AgentRelay`, from that sidecar's pid only)."""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import socket
import threading
from collections.abc import Callable

from testbed.runtime.access import listen_unix, log, peer_cred

HEADER_MAX_BYTES = 4096
HEADER_TIMEOUT_S = 5.0


def pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy a -> b until a closes, then shut b's sending side."""
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)


def splice(a: socket.socket, b: socket.socket) -> None:
    threading.Thread(target=pipe, args=(a, b), daemon=True).start()
    threading.Thread(target=pipe, args=(b, a), daemon=True).start()


class AgentRelay:
    """The agent's end: a Unix listener at `path`; each connection from one of `pids()` goes to the driver."""

    def __init__(self, path: str, machine: str, driver: tuple[str, int], secret: str,
                 pids: Callable[[], set[int]]) -> None:
        self.path, self.machine, self.driver, self.secret, self.pids = path, machine, driver, secret, pids
        self.srv = listen_unix(path, None)
        self.srv.settimeout(0.5)
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                c, _ = self.srv.accept()
            except (TimeoutError, OSError):
                continue
            pid, uid, _gid = peer_cred(c)
            if pid not in self.pids() or uid != 0:
                log(f"control relay {self.path}: refused pid {pid} (uid {uid}): not a worker this run started")
                c.close()
                continue
            try:
                up = socket.create_connection(self.driver, timeout=HEADER_TIMEOUT_S)
                up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # notices are small frames: no Nagle wait
                up.settimeout(None)
                up.sendall(json.dumps({"secret": self.secret, "machine": self.machine, "pid": pid}).encode() + b"\n")
            except OSError as e:
                log(f"control relay {self.path}: the driver at {self.driver} is unreachable ({e})")
                c.close()
                continue
            splice(c, up)

    def close(self) -> None:
        self.stopped.set()
        self.srv.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class DriverRelay:
    """The driver's end: a TCP listener on the cluster network; each connection that opens with the run's secret
    from a machine's own address goes to `vouched(sock, machine, pid)`."""

    def __init__(self, bind_ip: str, machines: dict[str, str], secret: str,
                 vouched: Callable[[socket.socket, str, int], None]) -> None:
        self.machines, self.secret, self.vouched = machines, secret, vouched
        self.srv = socket.create_server((bind_ip, 0))
        self.srv.settimeout(0.5)
        self.address = self.srv.getsockname()[:2]
        self.refused: list[str] = []
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                c, (ip, _port) = self.srv.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._admit, args=(c, ip), daemon=True).start()

    def _admit(self, c: socket.socket, ip: str) -> None:
        c.settimeout(HEADER_TIMEOUT_S)
        try:
            line = b""
            while not line.endswith(b"\n") and len(line) < HEADER_MAX_BYTES:
                chunk = c.recv(1)
                if not chunk:
                    break
                line += chunk
            head = json.loads(line)
            machine, pid = str(head["machine"]), int(head["pid"])
            ok = hmac.compare_digest(str(head["secret"]), self.secret) and self.machines.get(machine) == ip
        except (OSError, ValueError, KeyError, TypeError):
            ok, machine, pid = False, "?", 0
        if not ok:
            self.refused.append(f"control relay: refused a connection from {ip} (machine {machine})")
            log(self.refused[-1])
            c.close()
            return
        c.settimeout(None)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.vouched(c, machine, pid)

    def close(self) -> None:
        self.stopped.set()
        self.srv.close()


def to_unix(path: str) -> Callable[[socket.socket, str, int], None]:
    """A `DriverRelay` hand-off that carries each admitted connection to the Unix socket at `path`."""

    def vouched(c: socket.socket, machine: str, _pid: int) -> None:
        try:
            u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            u.connect(path)
        except OSError as e:
            log(f"relay to {path} (from machine {machine}): {e}")
            c.close()
            return
        splice(c, u)

    return vouched

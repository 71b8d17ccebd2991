"""Shipping finished KV caches to the decode process of each request's home DC (testbed/bubbletea/decode.py).

`KvShipper` moves the caches: per home DC `connections` TCP connections through the emulated WAN, a thread each.
A modeled run (filler of the cache's size over k) runs it in a process of its own at the lowest CPU priority,
`KvProcess`, so that the caches' CPU is never the worker's: threads at nice 19 inside the worker's interpreter
still share its GIL with training's threads (a starved sender that holds the GIL, or that a training thread has
handed it to, holds training up), and the sender's CPU time belongs to a process the run's timing health can
name. The real caches of `compute: torch` stay in the worker's process (the bytes live there).
Standard library only (role processes: tests/test_role_imports.py).
"""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
import time

from testbed.runtime.config import Endpoint
from testbed.runtime.lowcpu import lowest_cpu_priority
from testbed.runtime.wire import chunk_sizes, recv_ctrl, recv_exact, send_ctrl

MODULE = "testbed.bubbletea.kvsend"


class KvShipper:
    """Finished KV caches to the decode process of each request's home DC, off the training path: per home DC
    `connections` TCP connections through the emulated WAN, each with a thread that takes the next part, sends it
    and waits for the decode process's one-byte receipt (so `pending` counts parts not yet arrived, and `drain` can
    wait for them at the end of the run). A modeled cache (filler) is striped over the connections, one part each,
    as a training pipe stripes a transfer: alone on a link it gets the n-connection cap the simulator's KV flow has;
    a real cache goes whole (the decoder needs it so)."""

    FILLER = bytes(1 << 20)

    def __init__(self, decode: dict, connections: int = 1, low_cpu: bool = False) -> None:
        """`low_cpu`: the sender threads at the lowest CPU priority (testbed/runtime/lowcpu.py)."""
        self.decode, self.low_cpu = decode, low_cpu
        self.connections = max(1, connections)
        self.out: dict[str, queue.Queue] = {}
        self.pending = 0
        self.cv = threading.Condition()

    def ship(self, rid: int, first: int, tokens: int, data: bytes | int, home: str) -> None:
        """`data`: the cache's bytes, or how many bytes of filler stand for it (modeled compute)."""
        parts = [p for p in chunk_sizes(data, self.connections) if p > 0] if isinstance(data, int) else [data]
        with self.cv:
            self.pending += len(parts)
        if home not in self.out:
            q: queue.Queue = queue.Queue()
            self.out[home] = q
            for _ in range(self.connections):
                threading.Thread(target=self._sender, args=(home, q), daemon=True).start()
        for part in parts:
            self.out[home].put((rid, first, tokens, part, len(parts)))

    def drain(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for every cache shipped to reach its decode process; returns how many had not."""
        with self.cv:
            self.cv.wait_for(lambda: self.pending == 0, timeout_s)
            return self.pending

    def _sender(self, home: str, q: queue.Queue) -> None:
        if self.low_cpu:
            lowest_cpu_priority()
        ep = self.decode[home]
        sock = socket.create_connection((ep.ip, ep.port), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)  # a cache may wait long behind training (Atlas: the KV class goes last)
        while True:
            rid, first, tokens, data, parts = q.get()
            n = data if isinstance(data, int) else len(data)
            send_ctrl(sock, {"request": rid, "first": first, "tokens": tokens, "bytes": n, "parts": parts,
                             "t_send": time.monotonic()})
            if isinstance(data, int):
                view = memoryview(self.FILLER)
                while data > 0:
                    sock.sendall(view[:min(data, len(view))])
                    data -= len(view)
            else:
                sock.sendall(data)
            recv_exact(sock, 1)  # the decode process has it all
            with self.cv:
                self.pending -= 1
                self.cv.notify_all()


class KvProcess:
    """A modeled run's `KvShipper` in a child process at nice 19, behind the same `ship` and `drain`: the worker
    hands it (request, tokens, filler bytes, home DC) over a socket pair and never waits on it but in `drain`."""

    def __init__(self, decode: dict[str, Endpoint], connections: int = 1) -> None:
        mine, theirs = socket.socketpair()
        cfg = {"decode": {dc: [ep.ip, ep.port] for dc, ep in decode.items()}, "connections": connections}
        self.proc = subprocess.Popen([sys.executable, "-m", MODULE, str(theirs.fileno()), json.dumps(cfg)],
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock = mine
        self.lost = 0  # parts handed over after the process was gone (counted as not arrived)

    def ship(self, rid: int, first: int, tokens: int, data: int, home: str) -> None:
        try:
            send_ctrl(self.sock, {"op": "ship", "request": rid, "first": first, "tokens": tokens, "bytes": data,
                                  "home": home})
        except OSError:
            self.lost += 1

    def drain(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` (and a second for the answer) for the caches to arrive; returns how many parts had
        not; the process ends either way."""
        try:
            self.sock.settimeout(timeout_s + 1.0)
            send_ctrl(self.sock, {"op": "drain", "timeout_s": timeout_s})
            left = int(recv_ctrl(self.sock)["pending"])
        except (OSError, ValueError, KeyError):
            left = -1
        self.sock.close()
        try:
            self.proc.wait(2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return max(0, left) + self.lost if left >= 0 else max(1, self.lost)


def serve(sock: socket.socket, cfg: dict) -> None:
    """The child's loop: ship what the worker hands over until it asks for the drain (or goes away)."""
    lowest_cpu_priority(whole_process=True)
    decode = {dc: Endpoint(ip, int(port)) for dc, (ip, port) in cfg["decode"].items()}
    shipper = KvShipper(decode, int(cfg.get("connections", 1)))
    while True:
        try:
            msg = recv_ctrl(sock)
        except (OSError, ValueError, ConnectionError):
            return
        if msg.get("op") == "drain":
            send_ctrl(sock, {"pending": shipper.drain(float(msg.get("timeout_s", 0.0)))})
            return
        shipper.ship(int(msg["request"]), int(msg["first"]), int(msg["tokens"]), int(msg["bytes"]), str(msg["home"]))


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])), json.loads(sys.argv[2]))

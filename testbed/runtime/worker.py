"""A pipeline worker: one (stage, replica) of a plan, in its emulated host.

It runs the stage's action list (the same one the simulator executes). F(i) waits for activation i,
B(i) for gradient i; compute is `modeled` (waits the cost-model time). Each activation or gradient
(bytes already divided by the scale factor) is striped over the plan's n TCP connections to the
neighbouring stage, sent by one thread per connection while compute goes on. After the last
action, the stage's DP replicas run a ring all-reduce exchange over TCP (2(dp-1) steps of 1/dp of
the gradient). Between iterations it waits at the orchestrator's barrier (Megatron's global
gradient-norm all-reduce has the same effect). Intervals are recorded with time.monotonic().
Nothing polls: waits are on sockets and condition variables.

Usage: python -m testbed.runtime.worker CONFIG.json CONTROL.sock
"""

from __future__ import annotations

import json
import queue
import socket
import sys
import threading
import time

from testbed.runtime.wire import DATA, recv_ctrl, recv_exact, send_ctrl

ZEROS = bytes(4 * 2**20)
CONNECT_TIMEOUT = 30.0
WAIT_TIMEOUT = 120.0


class Inbox:
    """Chunks arriving from every connection; a key is complete when all its chunks are in."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.parts: dict[tuple, int] = {}
        self.done: dict[tuple, tuple[float, float]] = {}  # key -> (sender's start, last chunk in)
        self.error: BaseException | None = None

    def add(self, key: tuple, chunks: int, t_send: float) -> None:
        with self.cond:
            n = self.parts.get(key, 0) + 1
            self.parts[key] = n
            if n == chunks:
                self.done[key] = (t_send, time.monotonic())
                self.cond.notify_all()

    def fail(self, e: BaseException) -> None:
        with self.cond:
            self.error = e
            self.cond.notify_all()

    def wait(self, key: tuple) -> tuple[float, float]:
        with self.cond:
            ok = self.cond.wait_for(lambda: key in self.done or self.error is not None, WAIT_TIMEOUT)
            if self.error is not None:
                raise RuntimeError(f"a connection failed: {self.error}")
            if not ok:
                raise TimeoutError(f"waited {WAIT_TIMEOUT:g} s for {key}")
            return self.done.pop(key)


def reader(sock: socket.socket, inbox: Inbox) -> None:
    buf = bytearray(4 * 2**20)
    try:
        while True:
            kind, it, mb, _chunk, chunks, n, t_send = DATA.unpack(recv_exact(sock, DATA.size))
            left = n
            while left:
                k = min(left, len(buf))
                recv_exact(sock, k, buf)
                left -= k
            inbox.add((kind, it, mb), chunks, t_send)
    except (ConnectionError, OSError) as e:
        inbox.fail(e)


class Striped:
    """n connections to one peer; a message is split into n chunks sent in parallel."""

    def __init__(self, socks: list[socket.socket]) -> None:
        self.socks = socks
        self.queues: list[queue.Queue] = [queue.Queue() for _ in socks]
        for s, q in zip(socks, self.queues, strict=True):
            threading.Thread(target=self._sender, args=(s, q), daemon=True).start()

    @staticmethod
    def _sender(sock: socket.socket, q: queue.Queue) -> None:
        while True:
            job = q.get()
            if job is None:
                return
            header, n, done = job
            try:
                sock.sendall(header)
                view = memoryview(ZEROS)
                while n:
                    k = min(n, len(ZEROS))
                    sock.sendall(view[:k])
                    n -= k
            finally:
                done()

    def send(self, kind: bytes, it: int, mb: int, nbytes: int, on_done, sidecar: SidecarClient | None = None,
             replica: int = 0) -> None:
        n = len(self.socks)
        sizes = [nbytes // n + (1 if i < nbytes % n else 0) for i in range(n)]
        t0 = time.monotonic()
        left = [n]
        lock = threading.Lock()
        tid = f"{replica}{kind.decode()}{it}.{mb}"
        if sidecar:
            sidecar.notice({"op": "start", "replica": replica, "mb": mb, "id": tid})

        def one_done() -> None:
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    if sidecar:
                        sidecar.notice({"op": "end", "id": tid})
                    on_done(t0, time.monotonic())

        for i, (q, size) in enumerate(zip(self.queues, sizes, strict=True)):
            q.put((DATA.pack(kind, it, mb, i, n, size, t0), size, one_done))


class SidecarClient:
    """Fire-and-forget notices to a WAN link's Atlas sidecar, from a thread of their own so the send
    path never waits. If the sidecar is unreachable or dies, training carries on with the link's
    fair sharing and the worker reports the run as degraded."""

    def __init__(self, path: str, dev: str) -> None:
        self.dev = dev
        self.q: queue.Queue = queue.Queue()
        self.degraded: str | None = None
        threading.Thread(target=self._run, args=(path,), daemon=True).start()

    def notice(self, msg: dict) -> None:
        if self.degraded is None:
            self.q.put({**msg, "dev": self.dev} if msg["op"] == "start" else msg)

    def _run(self, path: str) -> None:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(1.0)
            s.connect(path)
        except OSError as e:
            self.degraded = f"Atlas sidecar unreachable ({e.strerror or e}): fair sharing"
            return
        while True:
            msg = self.q.get()
            try:
                send_ctrl(s, msg)
            except OSError as e:
                self.degraded = f"Atlas sidecar lost ({e.strerror or e}): fair sharing"
                return


def connect(ip: str, port: int, hello: dict, deadline: float) -> socket.socket:
    while True:
        try:
            s = socket.create_connection((ip, port), timeout=5)
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            send_ctrl(s, hello)
            return s
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # the peer's listener is not up yet (start-up only)


def main(cfg_path: str, ctl_path: str) -> None:
    with open(cfg_path) as f:
        cfg = json.load(f)
    s, r = cfg["stage"], cfg["replica"]
    ctl = socket.socket(socket.AF_UNIX)
    ctl.connect(ctl_path)
    send_ctrl(ctl, {"hello": [s, r]})
    inbox = Inbox()
    lst = socket.create_server((cfg["ip"], cfg["port"]), backlog=64)
    expect = cfg["prev_conns"] + (1 if cfg["ring"] else 0)
    accepted: dict[str, list[socket.socket]] = {"prev": [], "ring": []}

    def acceptor() -> None:
        for _ in range(expect):
            c, _ = lst.accept()
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = recv_ctrl(c)
            accepted[hello["role"]].append(c)
            threading.Thread(target=reader, args=(c, inbox), daemon=True).start()

    acc = threading.Thread(target=acceptor, daemon=True)
    acc.start()
    deadline = time.monotonic() + CONNECT_TIMEOUT
    nxt = prev = ring = None
    if cfg["next"]:
        ip, port, n = cfg["next"]
        socks = [connect(ip, port, {"role": "prev"}, deadline) for _ in range(n)]
        for c in socks:
            threading.Thread(target=reader, args=(c, inbox), daemon=True).start()
        nxt = Striped(socks)
    if cfg["ring"]:
        ip, port = cfg["ring"]
        ring = Striped([connect(ip, port, {"role": "ring"}, deadline)])
    acc.join(CONNECT_TIMEOUT)
    if acc.is_alive():
        raise TimeoutError("peers did not connect in time")
    if accepted["prev"]:
        prev = Striped(accepted["prev"])
    side_next = SidecarClient(*cfg["sidecar_next"]) if cfg.get("sidecar_next") else None
    side_prev = SidecarClient(*cfg["sidecar_prev"]) if cfg.get("sidecar_prev") else None
    send_ctrl(ctl, {"ready": [s, r]})

    log: list[list] = []
    log_lock = threading.Lock()

    def rec(kind: str, mb: int, t0: float, t1: float, nbytes: float = 0.0) -> None:
        with log_lock:
            log.append([kind, mb, t0, t1, nbytes])

    def sent(kind_bytes: float, i: int, pending: threading.Semaphore):
        def done(t0: float, t1: float) -> None:
            rec("send", i, t0, t1, kind_bytes)
            pending.release()

        return done

    fwd, bwd = cfg["fwd_s"], cfg["bwd_s"]
    act_out_wire = max(1, round(cfg["act_out"] / cfg["scale"]))  # the timeline keeps real-world bytes
    act_in_wire = max(1, round(cfg["act_in"] / cfg["scale"]))
    while True:
        msg = recv_ctrl(ctl)
        if "stop" in msg:
            break
        it, t_start = msg["go"], msg["t"]
        log.clear()
        pending = threading.Semaphore(0)
        sends = 0
        wake = t_start + cfg["offset_s"]
        if (d := wake - time.monotonic()) > 0:
            time.sleep(d)
        for op, i in cfg["actions"]:
            if op == "F":
                if s > 0:
                    t_send, t_in = inbox.wait((b"a", it, i))
                    rec("recv", i, t_send, t_in, cfg["act_in"])
                t0 = time.monotonic()
                time.sleep(fwd)
                rec("fwd", i, t0, time.monotonic())
                if nxt:
                    nxt.send(b"a", it, i, act_out_wire, sent(cfg["act_out"], i, pending), side_next, r)
                    sends += 1
            else:
                if nxt:
                    t_send, t_in = inbox.wait((b"g", it, i))
                    rec("recv", i, t_send, t_in, cfg["act_out"])
                t0 = time.monotonic()
                time.sleep(bwd)
                rec("bwd", i, t0, time.monotonic())
                if prev:
                    prev.send(b"g", it, i, act_in_wire, sent(cfg["act_in"], i, pending), side_prev, r)
                    sends += 1
        if ring:
            t0 = time.monotonic()
            steps, part = cfg["ring_steps"], cfg["ring_bytes"]
            for k in range(steps):
                ring.send(b"r", it, k, part, lambda a, b: None)
                inbox.wait((b"r", it, k))
            rec("allreduce", -1, t0, time.monotonic(), cfg["grad_bytes"])
        for _ in range(sends):
            pending.acquire()
        degraded = [c.degraded for c in (side_next, side_prev) if c and c.degraded]
        with log_lock:
            send_ctrl(ctl, {"done": it, "log": log, "degraded": degraded[0] if degraded else ""})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

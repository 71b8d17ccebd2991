"""A pipeline worker: one (stage, replica) of a plan, in its emulated host.

It executes its lowered program (testbed/program.py), the one the simulator executes: a Recv waits
for its message, Forward and Backward compute (`modeled`: the cost model's time; `torch`: a real
stage), a Send stripes its message (bytes divided by the scale factor) over the pipe's n TCP
connections, one sender thread per connection, while the program goes on; the AllReduce runs its
exchanges over TCP, and bucketed ReduceScatter and AllGather steps run theirs on a thread of their own
(`Buckets`) while the program goes on, until an Await needs them. Between iterations it waits at the
orchestrator's barrier (Megatron's global gradient-norm all-reduce has the same effect). Intervals are
recorded with time.monotonic(). Nothing polls: waits are on sockets and condition variables.

Usage: python -m testbed.runtime.worker CONFIG.json CONTROL.sock
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import queue
import selectors
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

from testbed.bubbletea.worker_side import KV_DRAIN_S, PrefillClient
from testbed.program import (
    AllGather,
    AllReduce,
    Await,
    Backward,
    BackwardWeight,
    Exchange,
    Forward,
    Optimizer,
    OuterSync,
    Program,
    Recv,
    ReduceScatter,
    Send,
    await_slot,
    collective_exchanges,
    exchanges,
    program_from_dict,
    ring_collectives,
)
from testbed.runtime import cpuclass
from testbed.runtime.announce import announcement, producers, transfer_id
from testbed.runtime.config import WorkerConfig
from testbed.runtime.htb import ALLREDUCE_TOS
from testbed.runtime.wire import DATA, chunk_offset, chunk_sizes, recv_ctrl, send_ctrl

ZEROS = bytes(4 * 2**20)
CONNECT_TIMEOUT = 30.0
WAIT_TIMEOUT = 120.0
RCVBUF_MARGIN = 64 * 1024
SLICE_BYTES = 16 * 1024  # what one connection gets written per turn of a striped send
MAX_LATE_S = 5e-3  # the most a modeled compute step is shortened to make up for late wake-ups
TIMED = {"mode": "off"}  # emulation.realtime for this worker's timed threads, set by main before any starts


def timed_thread() -> str:
    """Called first by each thread that waits on the modeled clock or for a message (the program's, senders,
    readers, sidecar notices, collectives): the run's CPU class for it (runtime/cpuclass.py). Threads the worker
    starts otherwise (KV shipping, the acceptor) begin in the normal class (SCHED_RESET_ON_FORK)."""
    return cpuclass.enter(TIMED["mode"], cpuclass.WORKER_PRIORITY, None, "worker")


def timed_mode(cfg: WorkerConfig) -> str:
    """The worker's real-time mode: the config's for modeled compute; off for torch, whose compute spins on the
    CPU (a real-time thread that computes would hold the CPU from everything normal)."""
    return cfg.realtime if cfg.compute == "modeled" else "off"


class Inbox:
    """Chunks arriving from every connection; a key is complete when all its chunks are in.
    With `keep` the payload is assembled (torch compute); modeled compute discards it."""

    def __init__(self, keep: bool = False, clock_s: float = 0.0) -> None:
        self.cond = threading.Condition()
        self.keep = keep
        self.clock_s = clock_s  # this machine's clock minus the orchestrator's, on which senders stamp (wire.py)
        self.parts: dict[tuple, int] = {}
        self.data: dict[tuple, bytearray] = {}
        self.done: dict[tuple, tuple[float, float]] = {}  # key -> (sender's start, last chunk in)
        self.error: BaseException | None = None
        self.on_complete = None  # called with a key when its last chunk is in (from the reader's thread)

    def buffer(self, key: tuple, total: int) -> bytearray:
        with self.cond:
            if key not in self.data:
                self.data[key] = bytearray(total)
            return self.data[key]

    def add(self, key: tuple, chunks: int, t_send: float) -> None:
        with self.cond:
            n = self.parts.get(key, 0) + 1
            self.parts[key] = n
            if n < chunks:
                return
            del self.parts[key]
            self.done[key] = (t_send + self.clock_s, time.monotonic())  # both on this machine's clock
            self.cond.notify_all()
        if self.on_complete is not None:
            self.on_complete(key)

    def payload(self, key: tuple) -> bytearray:
        with self.cond:
            return self.data.pop(key)

    def fail(self, e: BaseException) -> None:
        with self.cond:
            self.error = e
            self.cond.notify_all()

    def arrived(self, key: tuple) -> bool:
        with self.cond:
            return key in self.done

    def wait_until(self, key: tuple, deadline: float) -> bool:
        """Wait for `key` until a monotonic deadline; True if it arrived (no polling: a timed wait)."""
        with self.cond:
            return self.cond.wait_for(lambda: key in self.done or self.error is not None,
                                      max(0.0, deadline - time.monotonic())) and key in self.done

    def wait(self, key: tuple) -> tuple[float, float]:
        with self.cond:
            ok = self.cond.wait_for(lambda: key in self.done or self.error is not None, WAIT_TIMEOUT)
            if self.error is not None:
                raise RuntimeError(f"a connection failed: {self.error}")
            if not ok:
                raise TimeoutError(f"waited {WAIT_TIMEOUT:g} s for {key}")
            return self.done.pop(key)


def socket_buffer(window: int) -> int:
    """SO_RCVBUF for a connection with a clamped `window`: the kernel doubles it, and advertises a share of at least
    half, so the buffer never holds the window below the clamp (margin: a few segments in flight to the reader)."""
    return window + RCVBUF_MARGIN if window > 0 else 0


def set_buffer(sock: socket.socket, window: int) -> None:
    """A fixed receive buffer for `window` (before connecting or listening: the window scale is chosen from it;
    fixed, so the kernel's autotuning does not move the clamp)."""
    if window > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, socket_buffer(window))


def clamp_window(sock: socket.socket, window: int) -> None:
    """Hold the window this connection advertises to `window` bytes (0: leave the kernel's). The kernel
    resets the clamp when it first measures the connection's segments, so the reader applies it again after
    every message (a no-op once it holds)."""
    if window > 0:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP, window)


class _Incoming:
    """Where one connection is in its stream: reading a chunk's header, or `left` bytes of its payload."""

    __slots__ = ("head", "left", "key", "chunks", "t_send", "dst")

    def __init__(self) -> None:
        self.head = bytearray()
        self.left = 0
        self.key: tuple = ()
        self.chunks = 0
        self.t_send = 0.0
        self.dst: memoryview | None = None  # where the payload goes (torch compute), else discarded


def reader(socks: list[socket.socket], inbox: Inbox, window: int = 0, route: str = "") -> None:
    """Read the chunks arriving on a group of connections (a pipe's, or a ring peer's) in one thread: as NCCL's
    socket threads serve several sockets each, and because 70 threads, one per connection, each woken for its
    5 KB of a message, cost milliseconds per message on a busy machine (docs/fidelity.md). Reads never block
    (MSG_DONTWAIT), so the sockets stay blocking for the sender's writes."""
    timed_thread()
    buf = memoryview(bytearray(4 * 2**20))
    sel = selectors.DefaultSelector()
    for s in socks:
        clamp_window(s, window)
        sel.register(s, selectors.EVENT_READ, _Incoming())
    try:
        while True:
            for key, _ in sel.select():
                _read(key.fileobj, key.data, inbox, buf, window)  # type: ignore[arg-type]
    except (ConnectionError, OSError) as e:
        if e.errno == errno.ETIMEDOUT:  # the link carried nothing for the user timeout: end with one line
            abort(f"its connections {route} failed: {send_failure(e, socks)}")
        inbox.fail(OSError(e.errno, f"its connections {route}: {e.strerror or e}") if route else e)
    finally:
        sel.close()


def _read(sock: socket.socket, st: _Incoming, inbox: Inbox, buf: memoryview, window: int) -> None:
    """Take what `sock` has ready, chunk by chunk, without blocking."""
    while True:
        try:
            if st.left == 0:  # a header
                k = sock.recv_into(buf, DATA.size - len(st.head), socket.MSG_DONTWAIT)
                if k == 0:
                    raise ConnectionError("peer closed the connection")
                st.head += buf[:k]
                if len(st.head) < DATA.size:
                    continue
                kind, it, mb, chunk, chunks, n, total, t_send = DATA.unpack(st.head)
                st.head.clear()
                st.key, st.chunks, st.t_send, st.left = (kind, it, mb), chunks, t_send, n
                st.dst = None
                if inbox.keep:
                    off = chunk_offset(total, chunks, chunk)
                    st.dst = memoryview(inbox.buffer(st.key, total))[off:off + n]
                if n:
                    continue
            else:  # payload
                view = st.dst[len(st.dst) - st.left:] if st.dst is not None else buf[:min(st.left, len(buf))]
                k = sock.recv_into(view, len(view), socket.MSG_DONTWAIT)
                if k == 0:
                    raise ConnectionError("peer closed the connection")
                st.left -= k
                if st.left:
                    clamp_window(sock, window)  # a reset in the middle of a message opens it no further
                    continue
            inbox.add(st.key, st.chunks, st.t_send)
            clamp_window(sock, window)
        except BlockingIOError:
            return


CHUNK_SHIFT = 20  # a message's wire microbatch: its model chunk above this many bits, its microbatch below


def wire_mb(microbatch: int, chunk: int) -> int:
    """The data header's microbatch field for a message to model chunk `chunk` (virtual stages); the microbatch
    itself without them."""
    if not 0 <= microbatch < 1 << CHUNK_SHIFT or not 0 <= chunk < 1 << (32 - CHUNK_SHIFT):
        raise ValueError(f"microbatch {microbatch} chunk {chunk} does not fit the wire's 32-bit microbatch field")
    return chunk << CHUNK_SHIFT | microbatch


class Striped:
    """n connections to one peer; a message is split into n chunks sent in parallel by one thread, which
    writes to whichever connection has room (as NCCL's socket threads serve several sockets each). Each
    chunk's header goes out in the same segment as its first bytes: one thread and one packet per chunk
    less than a thread per connection and a header segment each, which cost milliseconds per message on
    70 connections (docs/fidelity.md)."""

    def __init__(self, socks: list[socket.socket], wakes: WaitStats | None = None, route: str = "",
                 clock_s: float = 0.0) -> None:
        self.socks = socks
        self.clock_s = clock_s  # this machine's clock minus the orchestrator's: chunks are stamped on the latter's
        self.queue: queue.Queue = queue.Queue()
        self.wakes = wakes  # how late the sender thread starts a message it was idle for (timing health)
        self.route = route  # how an error names these connections (their peer and WAN link)
        threading.Thread(target=self._sender, daemon=True).start()

    def _sender(self) -> None:
        timed_thread()
        sel = selectors.DefaultSelector()
        free_since = 0.0
        try:
            while True:
                job = self.queue.get()
                if job is None:
                    return
                parts, done, t_put = job
                if self.wakes is not None:
                    self.wakes.add(0.0, time.monotonic() - max(t_put, free_since))
                try:
                    _send_all(sel, parts)
                except OSError as e:  # nothing else waits on this thread: end the worker with one line
                    abort(f"its connections {self.route} failed: {send_failure(e, self.socks)}")
                finally:
                    done()
                    free_since = time.monotonic()
        finally:
            sel.close()

    def send(self, kind: bytes, it: int, mb: int, nbytes: int, on_done, sidecar: SidecarClient | None = None,
             replica: int = 0, payload: memoryview | None = None, stripes: int | None = None, chunk: int = 0,
             op: str = "start") -> None:
        """Stripe one message over the first `stripes` connections (all by default); `payload` (real bytes) or
        `nbytes` of zeros (modeled compute). `chunk`: the receiver's model chunk (virtual stages). `op`: the
        sidecar's notice as it is issued (`start`; `issue` to a predictive sidecar, which ranked it when announced)."""
        wmb = wire_mb(mb, chunk)
        n = min(stripes or len(self.socks), len(self.socks))
        if payload is not None:
            nbytes = len(payload)
        sizes = chunk_sizes(nbytes, n)
        t0 = time.monotonic()
        if sidecar:  # the receiver ends it (transfer_id): bytes in our socket buffer have not left yet
            sidecar.notice({"op": op, "replica": replica, "mb": mb, "kind": kind.decode(),
                            "id": transfer_id(replica, kind, it, wmb)})
        parts = []
        for i, (sock, size) in enumerate(zip(self.socks[:n], sizes, strict=True)):
            off = chunk_offset(nbytes, n, i)
            body = [payload[off:off + size]] if payload is not None else _zeros(size)
            parts.append((sock, [memoryview(DATA.pack(kind, it, wmb, i, n, size, nbytes, t0 - self.clock_s)), *body]))
        self.queue.put((parts, lambda: on_done(t0, time.monotonic()), time.monotonic()))


def _zeros(n: int) -> list[memoryview]:
    view = memoryview(ZEROS)
    return [view[:min(len(ZEROS), n - k)] for k in range(0, n, len(ZEROS))]


def _send_all(sel: selectors.BaseSelector, parts: list[tuple[socket.socket, list[memoryview]]]) -> None:
    """Write every socket's buffers, taking turns SLICE_BYTES at a time (as NCCL's socket threads do) so the
    connections' packets leave interleaved, not one connection's window after another's; each call takes what
    the socket accepts without blocking (MSG_DONTWAIT: the sockets stay blocking for their reader threads), and
    when every socket is full, wait for room.

    Each socket is corked (TCP_CORK) while its chunk is written and uncorked after its last byte, so only the
    chunk's end may leave as a short segment: with TCP_NODELAY a slice that ended inside a segment went out short
    whenever the window had room (MSG_MORE holds it only in the write, not when an acknowledgement sends the
    queue), and the next full segment no longer fit the window. An emulated window is a few segments (64 KiB is
    nine of a 7.4 KB path) and lost one for the round trip (docs/fidelity.md, "Short segments")."""
    left = {sock: bufs for sock, bufs in parts if bufs}
    corked: set[socket.socket] = set()
    try:
        for sock in left:
            _cork(sock, True)
            corked.add(sock)
        while left:
            progress = True
            while progress and left:
                progress = False
                for sock in list(left):
                    bufs = left[sock]
                    try:
                        k = sock.sendmsg(_head(bufs, SLICE_BYTES), [], socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        continue
                    progress = True
                    _advance(bufs, k)
                    if not bufs:
                        del left[sock]
                        _cork(sock, False)  # sends the short last segment
                        corked.discard(sock)
            if left:
                for sock in left:
                    sel.register(sock, selectors.EVENT_WRITE)
                sel.select()
                for sock in left:
                    sel.unregister(sock)
    finally:
        for sock in corked:  # a send that failed part-way: leave no socket corked
            with contextlib.suppress(OSError):
                _cork(sock, False)


def send_failure(e: OSError, socks: list[socket.socket]) -> str:
    """Why a connection failed, in the user's words: a timed-out connection is a link that carried nothing."""
    if e.errno == errno.ETIMEDOUT:
        ms = max(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) for s in socks)
        return (f"nothing acknowledged for {ms / 1000:g} s (network.tcp_user_timeout_s): the link carried nothing "
                f"that long")
    return str(e)


def abort(line: str) -> None:
    """End this worker now with `line` as its last words (the orchestrator reports a worker's last stderr line)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    os._exit(1)


def _cork(sock: socket.socket, on: bool) -> None:
    """TCP_CORK on a TCP socket (a Unix or UDP socket has no segments to hold)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, int(on))


def _head(bufs: list[memoryview], limit: int) -> list[memoryview]:
    """The first `limit` bytes of `bufs`, as views."""
    out, n = [], 0
    for b in bufs:
        if n + len(b) >= limit:
            out.append(b[:limit - n])
            return out
        out.append(b)
        n += len(b)
    return out


def _advance(bufs: list[memoryview], k: int) -> None:
    """Drop the first `k` bytes of `bufs` (sent)."""
    while k and bufs:
        if k >= len(bufs[0]):
            k -= len(bufs[0])
            bufs.pop(0)
        else:
            bufs[0] = bufs[0][k:]
            k = 0


RANKING_OPS = ("start", "announce", "issue")  # notices that name the link's device (an end names its transfer only)


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
        if self.degraded is None:  # "t": when it was sent (CLOCK_MONOTONIC; the sidecar it reaches is on this
            # machine, and one that forwards it to another machine's half moves it to that clock): its reaction
            msg = {**msg, "t": time.monotonic()}
            self.q.put({**msg, "dev": self.dev} if msg["op"] in RANKING_OPS else msg)

    def _run(self, path: str) -> None:
        timed_thread()
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


class WaitStats:
    """How late a worker's timed waits end against what they asked (a step's time taken minus the cost model's,
    after the compensation for late wake-ups): the timing health an emulated run reports (docs/reliability.md)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # sender threads add to one worker's wake-ups
        self.reset()

    def reset(self) -> None:
        self.n = 0
        self.late_sum_s = 0.0  # the late parts only: what can lengthen a critical path
        self.late_max_s = 0.0
        self.err_sum_s = 0.0  # signed: early waits count against late ones

    def add(self, asked_s: float, took_s: float) -> None:
        err = took_s - asked_s
        with self.lock:
            self.n += 1
            self.err_sum_s += err
            if err > 0:
                self.late_sum_s += err
                self.late_max_s = max(self.late_max_s, err)

    def as_list(self) -> list[float]:
        """[waits, sum of lateness, worst lateness, signed sum] (seconds), as the done message carries them."""
        with self.lock:
            return [self.n, self.late_sum_s, self.late_max_s, self.err_sum_s]


def unabsorbed_s(woke_late_s: float, compute_s: float, modeled: bool) -> float:
    """How much of a receiving thread's late resumption still delays the compute that follows: a modeled compute
    starts back at its input's arrival and takes that much less, so only the part beyond its own time remains; a
    real (torch) compute cannot start before the thread does."""
    return max(0.0, woke_late_s - compute_s) if modeled else woke_late_s


class Modeled:
    """Compute that waits the cost model's time and moves zeros of the plan's (scaled) sizes."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.losses: list[float] = []
        self.late = 0.0  # how much later than asked a sleep ends on this machine, on average
        self.waits = WaitStats()

    def wait(self, seconds: float) -> None:
        """Take `seconds`, on average: sleep that much less than asked by how late sleeps end here (0.2 ms each on
        a busy 2-core machine, 1-2 % of a modeled forward: docs/fidelity.md). Each wait's time against `seconds`
        goes to `waits` (a wait for nothing is not one)."""
        ask = max(0.0, seconds - self.late)
        t0 = time.monotonic()
        time.sleep(ask)
        took = time.monotonic() - t0
        if seconds > 0:
            self.waits.add(seconds, took)
        self.late = max(0.0, min(MAX_LATE_S, self.late + 0.1 * (took - ask - self.late)))

    def forward(self, it: int, st: Forward, inp: bytearray | None) -> memoryview | None:
        self.wait(st.seconds)
        return None

    def backward(self, it: int, st: Backward, grad: bytearray | None) -> memoryview | None:
        self.wait(st.seconds)
        return None

    def allreduce(self, steps: list[Exchange], peers: dict[str, Striped], inbox: Inbox, it: int, kind: bytes = b"r",
                  base: int = 0) -> None:
        """The exchanges in order; messages are keyed (kind, iteration, base + exchange), `base` telling apart the
        collectives of one program (a sync period's inner all-reduces, b"o" its OuterSyncs)."""
        for k, ex in enumerate(steps):
            peers[ex.send_to].send(kind, it, base + k, max(1, round(ex.bytes / self.cfg.scale)), lambda a, b: None)
            inbox.wait((kind, it, base + k))

    def step(self) -> None:
        self.wait(self.cfg.optimizer_s)


class TorchCompute(Modeled):
    """A real GPT-style stage: forward, backward, ring all-reduce of real gradients, AdamW step."""

    def __init__(self, cfg: WorkerConfig) -> None:
        import torch

        from testbed.runtime.torch_stage import Stage

        super().__init__(cfg)
        torch.set_num_threads(1)
        t = cfg.torch or {}
        self.t, self.torch = t, torch
        # the GPU this host is pinned to (hosts take GPUs round-robin), else the CPU
        n = torch.cuda.device_count()
        self.device = torch.device(f"cuda:{cfg.host_index % n}") if n else torch.device("cpu")
        prog = cfg.program
        self.first = prog.stage == 0
        self.last = not any(isinstance(st, Send) and st.kind == "a" for st in prog.steps)
        self.model = Stage(layers=t["layers"], hidden=t["hidden"], heads=t["heads"], vocab=t["vocab"], seq=t["seq"],
                           first=self.first, last=self.last, seed=1234 + prog.stage).to(self.device)  # same init
        # on every replica, so the all-reduced gradients keep the replicas identical
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=t["lr"])
        self.shape = (t["micro"], t["seq"], t["hidden"])
        self.saved: dict[int, tuple] = {}
        self.m = sum(isinstance(st, Forward) for st in prog.steps)

    def forward(self, it: int, st: Forward, inp: bytearray | None) -> memoryview | None:
        from testbed.runtime.torch_stage import batch, from_bytes, to_bytes

        t, i = self.t, st.microbatch
        toks, targets = batch(t["vocab"], t["seq"], t["micro"], replica=self.cfg.program.replica, iteration=it, mb=i)
        dev = self.device
        x = toks.to(dev) if self.first else from_bytes(inp, self.shape).to(dev).requires_grad_()
        y = self.model(x)
        if self.last:
            loss = self.torch.nn.functional.cross_entropy(y.reshape(-1, t["vocab"]), targets.to(dev).reshape(-1))
            self.losses.append(loss.item())
            self.saved[i] = (x, loss / self.m)
            return None
        self.saved[i] = (x, y)
        return to_bytes(y)

    def backward(self, it: int, st: Backward, grad: bytearray | None) -> memoryview | None:
        from testbed.runtime.torch_stage import from_bytes, to_bytes

        x, y = self.saved.pop(st.microbatch)
        if self.last:
            y.backward()
        else:
            y.backward(from_bytes(grad, self.shape).to(self.device))
        return None if self.first else to_bytes(x.grad)

    def allreduce(self, steps: list[Exchange], peers: dict[str, Striped], inbox: Inbox, it: int, kind: bytes = b"r",
                  base: int = 0) -> None:
        """Ring all-reduce (reduce-scatter, then all-gather) of the flattened gradients, averaged, around
        the program's ring (the emulator refuses a hierarchical one with torch compute)."""
        from testbed.runtime.torch_stage import to_bytes

        torch = self.torch
        params = [p for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        ar = next(st for st in self.cfg.program.steps if isinstance(st, AllReduce))
        ring_order = [g for rg in ar.rings for g in rg]
        dp, r = len(ring_order), ring_order.index(self.cfg.program.group)
        ring = peers[steps[0].send_to]
        parts = list(torch.tensor_split(flat.cpu(), dp))
        step = 0
        for k in range(dp - 1):  # reduce-scatter
            ring.send(b"r", it, step, 0, lambda a, b: None, payload=to_bytes(parts[(r - k) % dp]))
            inbox.wait((b"r", it, step))
            j = (r - k - 1) % dp
            parts[j] = parts[j] + torch.frombuffer(inbox.payload((b"r", it, step)), dtype=torch.float32)
            step += 1
        for k in range(dp - 1):  # all-gather
            ring.send(b"r", it, step, 0, lambda a, b: None, payload=to_bytes(parts[(r + 1 - k) % dp]))
            inbox.wait((b"r", it, step))
            j = (r - k) % dp
            parts[j] = torch.frombuffer(inbox.payload((b"r", it, step)), dtype=torch.float32).clone()
            step += 1
        flat = (torch.cat(parts) / dp).to(self.device)
        off = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[off:off + n].reshape(p.grad.shape))
            off += n

    def step(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


BUCKET_KIND = {"ReduceScatter": "reduce_scatter", "AllGather": "all_gather"}  # as the simulator's intervals
EXCHANGES_PER_SLOT = 4096  # a bucketed collective's exchange k travels as message slot * this + k


class Buckets:
    """The group's bucketed collectives (ReduceScatter, AllGather), on a thread of their own, one at a time in
    the order they were issued (as on one NCCL stream): each starts at its issue time or when the one before
    ends, runs its exchanges over the ring connections and marks its slot done for the Awaits."""

    def __init__(self, group: str, ring: dict[str, Striped], inbox: Inbox, scale: float, rec) -> None:
        self.group, self.ring, self.inbox, self.scale, self.rec = group, ring, inbox, scale, rec
        self.q: queue.Queue = queue.Queue()
        self.cond = threading.Condition()
        self.done: dict[tuple[int, int], float] = {}  # (iteration, slot) -> when it ended
        self.error: BaseException | None = None
        threading.Thread(target=self._run, daemon=True).start()

    def issue(self, st: ReduceScatter | AllGather, it: int) -> None:
        """Queue the collective; a reduce-scatter starts `after_s` from now (into the backward that follows)."""
        self.q.put((st, time.monotonic() + (st.after_s if isinstance(st, ReduceScatter) else 0.0), it))

    def _run(self) -> None:
        timed_thread()
        while True:
            st, at, it = self.q.get()
            time.sleep(max(0.0, at - time.monotonic()))  # issued into the compute that follows it
            slot = await_slot(type(st).__name__, st.bucket)
            t0 = time.monotonic()
            try:
                for k, ex in enumerate(collective_exchanges(st, self.group)):
                    mb = slot * EXCHANGES_PER_SLOT + k
                    self.ring[ex.send_to].send(b"b", it, mb, max(1, round(ex.bytes / self.scale)), lambda a, b: None)
                    self.inbox.wait((b"b", it, mb))
            except (OSError, RuntimeError, TimeoutError) as e:
                with self.cond:
                    self.error = e
                    self.cond.notify_all()
                return
            t1 = time.monotonic()
            self.rec(BUCKET_KIND[type(st).__name__], st.bucket, t0, t1, st.bytes)
            with self.cond:
                self.done[(it, slot)] = t1
                self.cond.notify_all()

    def await_step(self, st: Await, it: int, ahead: float) -> float:
        """Run an Await reached `ahead` seconds after the next compute may have started: wait for its collective,
        record the time it was exposed, and return how long ago the next compute may have started now."""
        reached = time.monotonic() - ahead
        start = max(reached, self.wait(st, it) - st.lead_s)
        if start > reached:
            self.rec("allreduce", -1, reached, start)  # the collective's exposed time
        return max(0.0, time.monotonic() - start)

    def wait(self, st: Await, it: int) -> float:
        """When collective (op, bucket) of iteration `it` ended, once it has."""
        key = (it, await_slot(st.collective, st.bucket))
        with self.cond:
            ok = self.cond.wait_for(lambda: key in self.done or self.error is not None, WAIT_TIMEOUT)
            if self.error is not None:
                raise RuntimeError(f"a bucketed collective failed: {self.error}")
            if not ok:
                raise TimeoutError(f"waited {WAIT_TIMEOUT:g} s for {st.collective} of bucket {st.bucket}")
            return self.done.pop(key)
class OuterSyncThread:
    """A fragment's OuterSync running beside the inner steps it overlaps (messages keyed b"o"); `join` waits for
    it and raises what it raised."""

    def __init__(self, comp: Modeled, steps: list[Exchange], peers: dict[str, Striped], inbox: Inbox, it: int,
                 st: OuterSync, rec) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(comp, steps, peers, inbox, it, st, rec), daemon=True)
        self.thread.start()

    def _run(self, comp: Modeled, steps, peers, inbox, it: int, st: OuterSync, rec) -> None:
        timed_thread()
        t0 = time.monotonic()
        try:
            comp.allreduce(steps, peers, inbox, it, b"o", st.fragment << 12)
        except BaseException as e:  # handed to join, in the worker's main thread
            self.error = e
            return
        rec("outersync", st.fragment, t0, time.monotonic(), st.bytes)

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise RuntimeError(f"outer sync failed: {self.error}") from self.error


# The IP TOS of a worker's connections by purpose: the all-reduce's get a class of their own on a host's NIC
PURPOSE_TOS = {"ring": ALLREDUCE_TOS}


def connect(ip: str, port: int, hello: dict, deadline: float, window: int = 0, tos: int = 0,
            user_timeout_s: float = 0.0) -> socket.socket:
    """A connection to a peer's `listen`ing socket, as every WAN connection of a worker is set up: the fixed
    receive buffer for `window` (0: the kernel's), IP TOS `tos`, no Nagle, TCP_USER_TIMEOUT `user_timeout_s`
    (0: the kernel's retries), then `hello` (what `accept` returns)."""
    while True:
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            set_buffer(s, window)
            if user_timeout_s > 0:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, round(user_timeout_s * 1000))
            if tos:
                s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            s.settimeout(5)
            try:
                s.connect((ip, port))
            except OSError:
                s.close()
                raise
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            send_ctrl(s, hello)
            return s
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # the peer's listener is not up yet (start-up only)


def route_of(prog: Program, peer: str) -> str:
    """How an error names this group's connections to `peer`: with the WAN link a pipe to it crosses."""
    wan = next((p.wan for p in prog.pipes if p.peer == peer and p.wan), None)
    return f"to {peer} over WAN link {wan[0]}-{wan[1]}" if wan else f"to {peer}"


def listen(ip: str, port: int, window: int = 0) -> socket.socket:
    """A listening socket whose accepted connections inherit the fixed receive buffer for `window` (0: the
    kernel's autotuned one)."""
    lst = socket.create_server((ip, port), backlog=64)
    set_buffer(lst, window)
    return lst


def accept(lst: socket.socket) -> tuple[socket.socket, dict]:
    """The next connection a peer opened with `connect`, and the hello it sent."""
    c, _ = lst.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c, recv_ctrl(c)


def window_of(cfg: WorkerConfig, peer: str, purpose: str) -> int:
    """The emulated TCP window (bytes) of this worker's connections with `peer`: the plan's window of the WAN
    link between them, divided by the scale factor; 0 inside a DC (the kernel's window)."""
    prog = cfg.program
    if purpose == "pipe":
        w = next((p.window_bytes for p in prog.pipes if p.peer == peer), 0.0)
    else:
        ar = next((c for c in ring_steps(prog) if getattr(c, "wan_window_bytes", ())), None)
        if ar is None:
            return 0
        me = next(k for k, ring in enumerate(ar.rings) if prog.group in ring)
        them = next(k for k, ring in enumerate(ar.rings) if peer in ring)
        if me == them:
            return 0
        w = ar.wan_window_bytes[me if them == (me + 1) % len(ar.rings) else them]  # the link between the two DCs
    return round(w / cfg.scale)


def listen_window(cfg: WorkerConfig) -> int:
    """The largest window of the WAN connections this worker may accept (its pipes' and its ring peers')."""
    prog = cfg.program
    wins = [window_of(cfg, p.peer, "pipe") for p in prog.pipes]
    for st in ring_steps(prog):
        wins += [window_of(cfg, ex.recv_from, "ring") for ex in collective_exchanges(st, prog.group)]
    return max(wins, default=0)


def ring_steps(prog) -> list:
    """The program's collectives over the ring connections, each distinct one once (a sync period repeats its
    inner all-reduce H times): all-reduces, OuterSyncs as all-reduces, and bucketed reduce-scatters and
    all-gathers."""
    return list(dict.fromkeys(ring_collectives(prog.steps)))


def connections_to_open(cfg: WorkerConfig) -> dict[str, tuple[int, str]]:
    """peer -> (connections, purpose) this worker opens: its pipe to each neighbouring stage (it sends on them
    only), and one to each peer it sends all-reduce exchanges to (the WAN ring's share of the NCCL connections)."""
    prog = cfg.program
    out: dict[str, tuple[int, str]] = {p.peer: (p.connections, "pipe") for p in prog.pipes}
    for st in ring_steps(prog):
        local = next(r for r in st.rings if prog.group in r)
        k = st.rings.index(local)
        conns = getattr(st, "wan_connections", ())
        wan = max(1, conns[k] // len(local)) if conns else 1
        for ex in collective_exchanges(st, prog.group):
            out.setdefault(ex.send_to, (1 if ex.send_to in local else wan, "ring"))
    return out


def connections_to_accept(cfg: WorkerConfig, peers: dict[str, WorkerConfig] | None = None) -> int:
    """How many connections the peers open to this worker: each neighbouring stage's pipe to it (as many
    connections as this worker's own pipe back: a link's window and connections are the same both ways), and one
    (or the WAN ring's share) from each peer it receives all-reduce exchanges from."""
    prog = cfg.program
    n = sum(p.connections for p in prog.pipes)
    peers: dict[str, int] = {}  # each peer opens one set of ring connections, whatever collectives use it
    for st in ring_steps(prog):
        local = next(r for r in st.rings if prog.group in r)
        conns = getattr(st, "wan_connections", ())
        for peer in dict.fromkeys(ex.recv_from for ex in collective_exchanges(st, prog.group)):
            ring = next(r for r in st.rings if peer in r)
            k = st.rings.index(ring)
            peers.setdefault(peer, 1 if peer in local else max(1, conns[k] // len(ring)) if conns else 1)
    return n + sum(peers.values())


def open_connections(cfg: WorkerConfig, wakes: WaitStats, inbox: Inbox) -> dict[tuple[str, str], Striped]:
    """Every connection this worker opens and accepts, with one reader per group of connections (started before
    anyone is ready: nothing is sent before the first "go"); returns the ones it opened, (peer, purpose) -> their
    striped sender. A worker sends on the connections it opened and receives on those it accepted."""
    prog = cfg.program
    lst = listen(cfg.ip, prog.port, listen_window(cfg))
    expect = connections_to_accept(cfg)
    accepted: dict[tuple[str, str], list[socket.socket]] = {}

    def acceptor() -> None:
        for _ in range(expect):
            c, hello = accept(lst)
            accepted.setdefault((str(hello["group"]), str(hello["purpose"])), []).append(c)

    acc = threading.Thread(target=acceptor, daemon=True)
    acc.start()
    deadline = time.monotonic() + CONNECT_TIMEOUT
    out: dict[tuple[str, str], Striped] = {}  # (peer, purpose) -> connections to it
    for peer, (n, purpose) in connections_to_open(cfg).items():
        ep = cfg.peers[peer]
        window = window_of(cfg, peer, purpose)
        socks = [connect(ep.ip, ep.port, {"group": prog.group, "purpose": purpose}, deadline, window,
                         PURPOSE_TOS.get(purpose, 0), cfg.user_timeout_s) for _ in range(n)]
        out[(peer, purpose)] = Striped(socks, wakes, route_of(prog, peer), cfg.clock_offset_s)
    acc.join(CONNECT_TIMEOUT)
    if acc.is_alive():
        raise TimeoutError("peers did not connect in time")
    for (peer, purpose), socks in [*((k, v.socks) for k, v in out.items()), *accepted.items()]:
        threading.Thread(target=reader, args=(socks, inbox, window_of(cfg, peer, purpose), route_of(prog, peer)),
                         daemon=True).start()
    return out


@dataclass
class Step:
    """Where a worker is inside one iteration's program."""

    it: int
    pending: threading.Semaphore  # one release per send that has left
    sends: int = 0
    data: object = None  # the last message in (for the next compute)
    out_data: object = None  # the last compute's output
    ahead: float = 0.0  # how long ago the next compute may have started (an Await's lead): it takes that much less
    n_ar: int = 0  # all-reduces so far (their messages' keys)
    syncs: dict[int, OuterSyncThread] = field(default_factory=dict)  # fragment -> its OuterSync in flight
    woke: float = 0.0  # how late this thread resumed for the last message, not yet taken back by a compute
    made: dict[int, tuple[int, ...]] = field(default_factory=dict)  # predictive: compute step -> the sends it makes


class Worker:
    """One (stage, replica): its connections, its log of intervals, and the steps of its program run in order."""

    def __init__(self, cfg: WorkerConfig, ctl: socket.socket) -> None:
        self.cfg, self.ctl = cfg, ctl
        self.cpu_class = cpuclass.current()  # the program thread's: real-time or nice (runtime/cpuclass.py)
        prog = self.prog = cfg.program
        self.torch_mode = cfg.compute == "torch"
        self.inbox = Inbox(keep=self.torch_mode, clock_s=cfg.clock_offset_s)
        self.wakes = WaitStats()  # how late threads resume for a message: sent (sender idle) or in (receiver waiting)
        out = open_connections(cfg, self.wakes, self.inbox)
        self.pipes = {p.peer: out[(p.peer, "pipe")] for p in prog.pipes}
        self.ring = {peer: st for (peer, purpose), st in out.items() if purpose == "ring"}
        self.sidecars = {peer: SidecarClient(path, next(p.wan for p in prog.pipes if p.peer == peer)[1])
                         for peer, path in cfg.sidecars.items()}
        # activations from the previous stage, gradients from the next
        self.senders = {st.kind.encode(): st.peer for st in prog.steps if isinstance(st, Recv)}
        self.inbox.on_complete = self.transfer_arrived
        self.log: list[list] = []
        self.log_lock = threading.Lock()
        self.comp = TorchCompute(cfg) if self.torch_mode else Modeled(cfg)
        self.buckets = Buckets(prog.group, self.ring, self.inbox, cfg.scale, self.rec)
        self.bt = PrefillClient(prog.group, cfg.bubbletea, cfg.compute, cfg.prefill, prog.dc)

    def transfer_arrived(self, key: tuple) -> None:
        """Tell the link's sidecar a transfer is over once its last byte is here: only then has it left
        the shaped link (a sender's sendall returns while its socket buffer still holds the tail)."""
        kind, it, mb = key
        side = self.sidecars.get(self.senders.get(kind, ""))
        if side:
            side.notice({"op": "end", "id": transfer_id(self.prog.replica, kind, it, mb)})

    def rec(self, kind: str, mb: int, t0: float, t1: float, nbytes: float = 0.0) -> None:
        with self.log_lock:
            self.log.append([kind, mb, t0, t1, nbytes])
        self.bt.busy(kind, t0, t1)  # training ops end BubbleTea's idle windows

    def sent(self, kind_bytes: float, i: int, pending: threading.Semaphore):
        def done(t0: float, t1: float) -> None:
            self.rec("send", i, t0, t1, kind_bytes)
            pending.release()

        return done

    def receive(self, st: Recv, it: int) -> tuple[bytearray | None, float]:
        """Wait for the step's message, serving prefill meanwhile; the payload (torch) and, without prefill to
        serve, how late this thread resumed after the message's last chunk came in (0 if it came before the wait)."""
        key = (st.kind.encode(), it, wire_mb(st.microbatch, st.chunk))
        t_wait = time.monotonic()
        self.bt.wait_for(self.inbox, key, self.rec)
        t_send, t_in = self.inbox.wait(key)
        late = time.monotonic() - t_in if self.cfg.bubbletea is None and t_in > t_wait else 0.0
        self.rec("recv", st.microbatch, t_send, t_in, st.bytes)
        return (self.inbox.payload(key) if self.torch_mode else None), late

    def announce(self, x: Step, p_it, i: int, at: float) -> None:
        """Predictive sidecar: announce the WAN sends compute step `i` makes, issued at `at` (runtime/announce.py)."""
        for j in x.made.get(i, ()):
            send = p_it.steps[j]
            side = self.sidecars.get(send.peer)
            if side:
                side.notice(announcement(send, self.prog.replica, x.it, wire_mb(send.microbatch, send.chunk), at))

    def step(self, st, x: Step, p_it, i: int = -1) -> None:
        """Run step `i` (`st`) of the iteration's program `p_it`."""
        t, it, comp, prog = type(st), x.it, self.comp, self.prog
        compute = t is Forward or t is Backward or t is BackwardWeight
        if x.woke and not compute:
            self.wakes.add(0.0, x.woke)  # a late wake-up that no compute absorbs: the timing health counts it
            x.woke = 0.0
        if t is Recv:
            x.data, x.woke = self.receive(st, it)
            # a modeled GPU starts on its input when it arrives: the thread's late resumption is the emulator's,
            # so the compute that follows starts then and takes that much less
            x.ahead = 0.0 if self.torch_mode else x.woke
        elif compute:  # W: modeled only (torch refuses "zb")
            if x.woke:  # what the compute could not absorb still lengthens the path
                self.wakes.add(0.0, unabsorbed_s(x.woke, st.seconds, not self.torch_mode))
                x.woke = 0.0
            now = time.monotonic()
            run = dataclasses.replace(st, seconds=max(0.0, st.seconds - x.ahead)) if x.ahead else st
            if x.made:
                self.announce(x, p_it, i, now + run.seconds)
            x.out_data = (comp.forward if t is Forward else comp.backward)(it, run, x.data)
            self.rec("fwd" if t is Forward else "bwd", st.microbatch, now - x.ahead, time.monotonic())
            x.data, x.ahead = None, 0.0
        elif t is ReduceScatter or t is AllGather:
            self.buckets.issue(st, it)
        elif t is Await:
            x.ahead = self.buckets.await_step(st, it, x.ahead)
        elif t is Send:
            nbytes = max(1, round(st.bytes / self.cfg.scale))
            self.pipes[st.peer].send(st.kind.encode(), it, st.microbatch, nbytes,
                                     self.sent(st.bytes, st.microbatch, x.pending), self.sidecars.get(st.peer),
                                     prog.replica, x.out_data, p_it.pipe(st.peer).connections, st.chunk,
                                     "issue" if self.cfg.predictive else "start")
            x.sends += 1
        elif t is AllReduce:
            t0 = time.monotonic()
            comp.allreduce(exchanges(st, prog.group), self.ring, self.inbox, it, b"r", x.n_ar << 12)
            x.n_ar += 1
            self.rec("allreduce", -1, t0, time.monotonic(), st.bytes)
        elif t is Optimizer:  # an inner step's (a sync period's program)
            t0 = time.monotonic()
            if self.torch_mode:
                comp.step()
            else:
                comp.wait(st.seconds)
            self.rec("optimizer", -1, t0, time.monotonic())
        elif t is OuterSync:
            x.syncs[st.fragment] = OuterSyncThread(comp, exchanges(st.as_allreduce(), prog.group), self.ring,
                                                   self.inbox, it, st, self.rec)
        else:  # OuterWait
            x.syncs.pop(st.fragment).join()

    def iteration(self, msg: dict) -> None:
        """One iteration from the orchestrator's go, then its done with the log. A changing WAN re-plans each
        iteration (testbed/emu/wanchange.py): the go carries this iteration's program, run over the connections
        opened at the start (as many as any iteration needs), striping as its pipes say."""
        it, t_start = msg["go"], msg["t"]
        p_it = program_from_dict(msg["program"]) if "program" in msg else self.prog
        comp, bt = self.comp, self.bt
        self.log.clear()
        comp.losses.clear()
        comp.waits.reset()
        self.wakes.reset()
        made = producers(p_it.steps) if self.cfg.predictive and self.sidecars else {}
        x = Step(it, threading.Semaphore(0), made=made)
        bt.begin(it, t_start)
        bt.wait_until(t_start + p_it.offset_s, self.rec)  # the replica's stagger, serving prefill meanwhile
        for i, st in enumerate(p_it.steps):
            self.step(st, x, p_it, i)
        if not any(type(st) is Optimizer for st in p_it.steps):
            t0 = time.monotonic()
            comp.step()
            self.rec("optimizer", -1, t0, time.monotonic())
        for _ in range(x.sends):
            x.pending.acquire()
        bt.drain(self.rec)  # jobs planned after this worker's last training op (the drain bubble)
        bt.end(it)
        degraded = [c.degraded for c in self.sidecars.values() if c.degraded] + ([bt.degraded] if bt.degraded else [])
        with self.log_lock:
            send_ctrl(self.ctl, {"done": it, "log": self.log, "degraded": degraded[0] if degraded else "",
                                 "waits": comp.waits.as_list(), "wakes": self.wakes.as_list(),
                                 "cpu_class": self.cpu_class,
                                 "loss": sum(comp.losses) / len(comp.losses) if comp.losses else None})


def main(cfg_path: str, ctl_path: str) -> None:
    with open(cfg_path) as f:
        cfg = WorkerConfig.from_json(f.read())
    s, r = cfg.program.stage, cfg.program.replica
    TIMED["mode"] = timed_mode(cfg)
    try:
        timed_thread()  # the program's thread, before it starts any other
    except cpuclass.RealtimeError as e:
        raise SystemExit(f"worker {s}.{r}: {e}") from None
    ctl = socket.socket(socket.AF_UNIX)
    ctl.connect(ctl_path)
    send_ctrl(ctl, {"hello": [s, r]})
    worker = Worker(cfg, ctl)
    send_ctrl(ctl, {"ready": [s, r]})
    while True:
        msg = recv_ctrl(ctl)
        if "stop" in msg:
            worker.bt.close(KV_DRAIN_S)  # KV caches still crossing the WAN: a bounded wait (the rest do not arrive)
            break
        worker.iteration(msg)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

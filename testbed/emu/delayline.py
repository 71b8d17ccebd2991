"""Constant one-way delay for kernels without netem: an NFQUEUE delay line.

Runs inside a WAN namespace: iptables sends each direction's forwarded packets to its own queue,
this process holds each packet's id until its deadline, then accepts every id up to the newest due
one with a single batch verdict (valid because a queue's delay is constant, so packets leave in
arrival order). Only metadata is copied (COPY_META) and GSO skbs are queued whole, which keeps a
2-vCPU VM transparent at 100-200 Mbit/s with MTU 9000 (bench/link_fidelity.py, docs/emulation.md). Pure
Python: the PyPI NetfilterQueue binding has no GSO flag and measured 51-62 Mbit/s at 100 Mbit/s.

A queue's delay can change while it runs (a WAN that changes, testbed/emu/wanchange.py): `--control PATH` binds a
Unix datagram socket that takes JSON `{"delays_ms": {"QNUM": DELAY_MS, ...}}` and `{"hold": true|false}`.
A new delay applies to packets that arrive from then on; a packet never leaves before one that arrived earlier
(a shorter delay drains the queue in order, as a real path would), so the batch verdict stays valid.
A hold is a link that is down: packets already on their way arrive, packets that come while it holds wait, and
leave one delay after it lets go (nothing is dropped, so TCP does not back off; it stops when its window is
full). Each hold is recorded (`holds` in the stats file: when it began, when its first packet came, when it
ended, how many packets waited) on the monotonic clock every namespace shares.

No fail-open flag and no --queue-bypass: if this process dies, the link stops instead of silently
losing its delay. Packet ids are 32-bit; at 10k packets/s they wrap after about 5 days (not handled).

`--realtime auto|on|off` (default off) puts the packet loop in the real-time class (testbed/runtime/cpuclass.py,
ahead of the workers); without it, or where it is refused, `--nice N` sets its CPU priority (default -10: the
emulated link ahead of the workload; BubbleTea's KV caches get a line of their own at 19 and never the real-time
class, testbed/bubbletea/kvdelay.py). The stats file names the class the loop ran in (`cpu_class`).

Usage: python -m testbed.emu.delayline [--stats-file F] [--control PATH] [--nice N] [--realtime MODE]
       QNUM:DELAY_MS [QNUM:DELAY_MS ...]
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

from testbed.runtime import cpuclass

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 2, 3
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 4
NFQA_PACKET_HDR, NFQA_VERDICT_HDR, NFQA_TIMESTAMP = 1, 2, 4
NF_ACCEPT = 1
SOL_NETLINK, NETLINK_NO_ENOBUFS = 270, 5
SO_RCVBUFFORCE = 33
SO_TIMESTAMP = 29  # SO_TIMESTAMP_OLD: Python's socket module does not export it
MAXLEN = 200_000
EARLY_GAIN = 0.05  # how fast the release learns its lateness (an exponential average over ~20 wake-ups)
MAX_EARLY_S = 2e-3
HELD = float("inf")  # the deadline of a packet that came while the line holds (the link is down)


def _attr(atype: int, payload: bytes) -> bytes:
    ln = 4 + len(payload)
    return struct.pack("=HH", ln, atype) + payload + b"\0" * ((4 - ln % 4) % 4)


class Queue:
    """One NFQUEUE number with a constant delay."""

    def __init__(self, line: DelayLine, qnum: int, delay_s: float) -> None:
        self.line, self.qnum, self.delay = line, qnum, delay_s
        self.pending: collections.deque[tuple[float, int]] = collections.deque()
        self.packets = 0
        self.lag_sum = 0.0  # release - due, summed: the run's timing health reads it (testbed/emu/health.py)
        self.lag_max = 0.0
        self.released = 0
        self.stamped = 0  # packets whose kernel arrival time came with them
        self.inbound_sum = 0.0  # kernel arrival -> this process: what the timestamps take out of the delay
        self.early = 0.0  # release this much before a deadline: the wake-up lateness this process has seen
        self.last = 0.0  # the latest deadline given: packets leave in arrival order
        self.changes = 0
        self.held = 0  # packets waiting in the current hold
        self.first_held = None

    def msg(self, mtype: int, payload: bytes, flags: int = NLM_F_REQUEST) -> bytes:
        self.line.seq += 1
        body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(self.qnum)) + payload
        return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | mtype, flags, self.line.seq, 0) + body

    def bind(self) -> None:
        af = socket.htons(socket.AF_INET)
        self.line.config(self, _attr(NFQA_CFG_CMD, struct.pack("=BBH", NFQNL_CFG_CMD_BIND, 0, af)))
        self.line.config(self, _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)))
        self.line.config(self, _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", MAXLEN)))
        self.line.config(self, _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO))
                         + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO)))

    def release(self, now: float) -> None:
        """Accept every packet due by `now`, deadlines brought forward by `early` (see `woke`)."""
        pend, last = self.pending, None
        while pend and pend[0][0] - self.early <= now:
            deadline, last = pend.popleft()
            lag = now - deadline
            self.lag_sum += lag
            self.lag_max = max(self.lag_max, lag)
            self.released += 1
        if last is not None:
            verdict = _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, last))
            self.line.sock.send(self.msg(NFQNL_MSG_VERDICT_BATCH, verdict))

    def woke(self, late: float) -> None:
        """A timed wait for this queue's next deadline ended `late` seconds after it should have: `early`
        follows the mean lateness of such wake-ups, so packets leave on time on average (0.2-0.3 ms late each way
        without it, idle; more on a busy machine). Only timer wake-ups teach it: a release delayed by reading a
        burst of packets says nothing about the next sleep."""
        self.early = max(0.0, min(MAX_EARLY_S, self.early + EARLY_GAIN * (late - self.early)))

    def unbind(self) -> None:
        af = socket.htons(socket.AF_INET)
        with contextlib.suppress(OSError):
            self.line.sock.send(self.msg(NFQNL_MSG_CONFIG, _attr(NFQA_CFG_CMD, struct.pack(
                "=BBH", NFQNL_CFG_CMD_UNBIND, 0, af))))


class DelayLine:
    def __init__(self, specs: dict[int, float]) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.bind((0, 0))
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 * 2**20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.seq = 0
        self.queues = {q: Queue(self, q, d) for q, d in specs.items()}
        self.cpu_class = cpuclass.NICE  # the class the packet loop runs in (main: cpuclass.enter)
        for q in self.queues.values():
            q.bind()
        # A socket that asks for receive timestamps turns on the kernel's timestamping of every received packet
        # (a global switch), so NFQUEUE tells us when each packet arrived: its delay then runs from there, not
        # from when this process got round to reading it (0.1 ms idle, milliseconds on a busy machine).
        self.stamper = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.stamper.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
        self.sock.setblocking(False)
        self.running = True
        self.bad_control = 0
        self.hold_since: float | None = None
        self.holds: list[dict] = []

    def config(self, q: Queue, payload: bytes) -> None:
        self.sock.send(q.msg(NFQNL_MSG_CONFIG, payload, NLM_F_REQUEST | NLM_F_ACK))
        while True:  # wait for the ACK; packets may already be interleaved
            data = self.sock.recv(65536)
            _ln, mtype = struct.unpack_from("=IH", data, 0)
            if mtype == NLMSG_ERROR:
                err = struct.unpack_from("=i", data, 16)[0]
                if err:
                    raise OSError(-err, f"binding NFQUEUE {q.qnum}: {os.strerror(-err)}")
                return
            self.dispatch(data)

    def dispatch(self, data: bytes) -> None:
        """Parse netlink messages; queue each packet id with its deadline: its kernel arrival time (or, without a
        timestamp, now) plus the queue's delay. Deadlines never go backwards in a queue (the batch verdict
        releases in arrival order); while the line holds (the link is down) packets wait for the release."""
        off, n, now = 0, len(data), time.monotonic()
        real_to_mono = now - time.time()
        unpack = struct.unpack_from
        while off + 16 <= n:
            ln, mtype = unpack("=IH", data, off)
            if ln < 16:
                break
            if (mtype & 0xFF) == NFQNL_MSG_PACKET and (mtype >> 8) == NFNL_SUBSYS_QUEUE:
                q = self.queues.get(unpack("!H", data, off + 18)[0])
                a, end = off + 20, off + ln
                pid, arrived = None, now
                while q is not None and a + 4 <= end:
                    alen, atype = unpack("=HH", data, a)
                    atype &= 0x7FFF
                    if atype == NFQA_PACKET_HDR:
                        pid = unpack("!I", data, a + 4)[0]
                    elif atype == NFQA_TIMESTAMP and alen >= 20:
                        sec, usec = unpack("!QQ", data, a + 4)
                        arrived = min(now, sec + usec * 1e-6 + real_to_mono)
                        q.stamped += 1
                        q.inbound_sum += now - arrived
                    a += (alen + 3) & ~3
                if q is not None and pid is not None:
                    due = arrived + q.delay
                    if self.hold_since is not None:  # the link is down: it waits for the release
                        due = HELD
                        q.held += 1
                        if q.first_held is None:
                            q.first_held = now
                    elif due < q.last:
                        due = q.last  # the delay was shortened, or packets came out of order: keep arrival order
                    else:
                        q.last = due
                    q.pending.append((due, pid))
                    q.packets += 1
            off += (ln + 3) & ~3

    def stats(self) -> dict:
        t = os.times()
        return {"pid": os.getpid(), "cpu_s": t.user + t.system, "wall": time.monotonic(),
                "queues": {q.qnum: {"delay_ms": q.delay * 1e3, "packets": q.packets, "pending": len(q.pending),
                                    "changes": q.changes, "stamped": q.stamped,
                                    "inbound_avg_us": q.inbound_sum / max(q.stamped, 1) * 1e6,
                                    "lag_avg_us": q.lag_sum / max(q.released, 1) * 1e6, "early_us": q.early * 1e6,
                                    "lag_max_us": q.lag_max * 1e6, "released": q.released,
                                    "lag_sum_s": q.lag_sum} for q in self.queues.values()},
                "holds": self.holds, "holding_since": self.hold_since, "cpu_class": self.cpu_class}

    def control(self, data: bytes) -> None:
        """{"delays_ms": {"QNUM": DELAY_MS}} and/or {"hold": bool}. A malformed datagram is ignored (and counted)."""
        try:
            msg = json.loads(data)
            for q, ms in msg.get("delays_ms", {}).items():
                d = float(ms)
                if int(q) in self.queues and 0 <= d <= 10_000:
                    self.queues[int(q)].delay = d / 1e3
                    self.queues[int(q)].changes += 1
            if "hold" in msg:
                self.set_hold(bool(msg["hold"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            self.bad_control += 1

    def set_hold(self, on: bool) -> None:
        now = time.monotonic()
        if on and self.hold_since is None:
            self.hold_since = now
        elif not on and self.hold_since is not None:
            for q in self.queues.values():  # held packets enter the wire now, in order, behind the others
                due = max(now + q.delay, q.last)
                q.pending = collections.deque((due if d == HELD else d, i) for d, i in q.pending)
                q.last = due
                self.holds.append({"queue": q.qnum, "from": self.hold_since, "first": q.first_held, "to": now,
                                   "packets": q.held})
                q.held, q.first_held = 0, None
            self.hold_since = None

    def run(self, stats_file: str | None, ctl: socket.socket | None = None) -> None:
        buf = bytearray(256 * 1024)
        mv = memoryview(buf)
        fd = self.sock.fileno()
        fds = [fd] + ([ctl.fileno()] if ctl is not None else [])
        qs = list(self.queues.values())
        next_stats = time.monotonic()
        writer = StatsWriter(stats_file) if stats_file else None
        while self.running:
            now = time.monotonic()
            wait, next_q = 0.2, None  # finite, so SIGTERM is honoured even when idle
            for q in qs:
                if q.pending and q.pending[0][0] - q.early <= now:
                    q.release(now)
                if q.pending and q.pending[0][0] - q.early - now < wait:
                    wait, next_q = q.pending[0][0] - q.early - now, q
            try:
                ready, _, _ = select.select(fds, [], [], max(wait, 0.0))  # select: microsecond timeout
            except InterruptedError:
                continue
            if not ready and next_q is not None:
                next_q.woke(time.monotonic() - now - max(wait, 0.0))
            if ctl is not None and ctl.fileno() in ready:
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    self.control(ctl.recv(65536))
                    next_stats = now  # the orchestrator reads a hold's record from the stats file
            if fd in ready:
                while True:
                    try:
                        nb = self.sock.recv_into(buf)
                    except BlockingIOError:
                        break
                    except InterruptedError:
                        continue
                    self.dispatch(bytes(mv[:nb]))
            if writer is not None and now >= next_stats:
                next_stats = now + 1.0
                writer.put(json.dumps(self.stats()))
        self.set_hold(False)
        for q in qs:
            q.release(float("inf"))
            q.unbind()
        if writer is not None:
            writer.close(json.dumps(self.stats()))


class StatsWriter:
    """Writes the stats file from its own thread, so the packet loop never waits on the disk: replacing a file on
    ext4 took 18-54 ms now and then on an idle 2-vCPU VM (more while Docker or a test run writes), and every packet
    due meanwhile left that much late, a burst of pings held together. Only the newest snapshot is kept."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.cond = threading.Condition()
        self.latest: str | None = None
        self.closing = False
        self.thread = threading.Thread(target=self._run, name="stats", daemon=True)
        self.thread.start()

    def put(self, text: str) -> None:
        with self.cond:
            self.latest = text
            self.cond.notify()

    def close(self, final: str) -> None:
        """Stop the thread, then write `final` (the last word, after every packet has left)."""
        with self.cond:
            self.closing = True
            self.latest = None
            self.cond.notify()
        self.thread.join()
        _write_text(self.path, final)

    def _run(self) -> None:
        while True:
            with self.cond:
                while self.latest is None and not self.closing:
                    self.cond.wait()
                if self.closing:
                    return
                text, self.latest = self.latest, None
            _write_text(self.path, text)


def _write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def parse_specs(args: list[str]) -> dict[int, float]:
    specs = {}
    for a in args:
        q, _, d = a.partition(":")
        if not q.isdigit() or not d:
            raise SystemExit(f"delayline: bad spec {a!r}; use QNUM:DELAY_MS")
        specs[int(q)] = float(d) / 1e3
    if not specs:
        raise SystemExit("delayline: give at least one QNUM:DELAY_MS")
    return specs


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    stats_file = ctl_path = None
    if "--stats-file" in argv:
        i = argv.index("--stats-file")
        stats_file = argv[i + 1]
        del argv[i : i + 2]
    if "--control" in argv:
        i = argv.index("--control")
        ctl_path = argv[i + 1]
        del argv[i : i + 2]
    nice = -10  # the emulated link itself: ahead of the workload on a busy machine
    if "--nice" in argv:
        i = argv.index("--nice")
        nice = int(argv[i + 1])
        del argv[i : i + 2]
    mode = "off"
    if "--realtime" in argv:
        i = argv.index("--realtime")
        mode = argv[i + 1]
        del argv[i : i + 2]
    line = DelayLine(parse_specs(argv))
    try:
        line.cpu_class = cpuclass.enter(mode, cpuclass.LINK_PRIORITY, nice, "delay line")
    except (cpuclass.RealtimeError, ValueError) as e:
        raise SystemExit(f"delayline: {e}") from None
    ctl = None
    if ctl_path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(ctl_path)
        ctl = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        ctl.bind(ctl_path)
        ctl.setblocking(False)

    def stop(*_: object) -> None:
        line.running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)
    try:
        line.run(stats_file, ctl)
    finally:
        if ctl is not None:
            ctl.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(ctl_path)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()

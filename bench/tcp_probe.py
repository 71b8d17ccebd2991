"""A TCP probe that runs inside an emulated host (bench/tcp_fidelity.py starts it): messages of a given size
on one warmed connection, each timed from its first byte handed to the socket to its last byte read by the
receiver (both ends on one machine share CLOCK_MONOTONIC), or a bulk stream for a while.

  python bench/tcp_probe.py server PORT
  python bench/tcp_probe.py messages IP PORT BYTES COUNT GAP_S   one JSON line: [[start, arrival], ...]
  python bench/tcp_probe.py sink PORT SKIP_S                       after the sender closes, one JSON line: the
                                                                  goodput after the first SKIP_S seconds
  python bench/tcp_probe.py bulk IP PORT SECONDS                  send as fast as the connection takes
  python bench/tcp_probe.py pipe-server PORT N COUNT WINDOW        the workers' striped transport: COUNT messages
  python bench/tcp_probe.py pipe-client IP PORT N BYTES COUNT GAP_S  over N connections, each [start, arrival]
  python bench/tcp_probe.py pipe-backlog IP PORT N BYTES COUNT ROUNDS GAP_S  ROUNDS times COUNT messages queued
                                                                  at once, GAP_S between rounds
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import time

HEAD = struct.Struct("!Qd")  # message bytes (0: stop), the sender's start time
ZEROS = bytes(1 << 20)


def recv_exact(s: socket.socket, n: int, buf: bytearray) -> None:
    view = memoryview(buf)
    while n:
        k = s.recv_into(view[: min(n, len(buf))])
        if not k:
            raise ConnectionError("closed")
        n -= k


def server(port: int, clamp: int = 0) -> None:
    lst = socket.create_server(("0.0.0.0", port))
    print("ready", flush=True)
    c, _ = lst.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(1 << 20)
    while True:
        head = bytearray(HEAD.size)
        recv_exact(c, HEAD.size, head)
        n, t0 = HEAD.unpack(head)
        if clamp:  # after every message, as the workers do
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP, clamp)
        if n == 0:
            return
        recv_exact(c, n, buf)
        c.sendall(struct.pack("!d", time.monotonic()))  # when the last byte was here


def send_zeros(s: socket.socket, n: int) -> None:
    view = memoryview(ZEROS)
    while n:
        k = min(n, len(ZEROS))
        s.sendall(view[:k])
        n -= k


def messages(ip: str, port: int, nbytes: int, count: int, gap_s: float) -> None:
    s = socket.create_connection((ip, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = []
    for _ in range(count):
        t0 = time.monotonic()
        s.sendall(HEAD.pack(nbytes, t0))
        send_zeros(s, nbytes)
        t1 = struct.unpack("!d", s.recv(8, socket.MSG_WAITALL))[0]
        out.append([t0, t1])
        time.sleep(gap_s)
    s.sendall(HEAD.pack(0, 0.0))
    print(json.dumps(out), flush=True)


def sink(port: int, skip_s: float, clamp: int = 0, rcvbuf: int = 0) -> None:
    lst = socket.create_server(("0.0.0.0", port))
    if rcvbuf:
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    print("ready", flush=True)
    c, _ = lst.accept()
    buf = bytearray(1 << 20)
    t0 = time.monotonic()
    t_mark = got = 0
    while k := c.recv_into(buf):
        if clamp:  # as the workers do: the kernel resets the clamp when it first measures the segments
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_WINDOW_CLAMP, clamp)
        now = time.monotonic()
        if now - t0 < skip_s:
            t_mark = now
        else:
            got += k
    print(json.dumps({"bytes": got, "seconds": time.monotonic() - t_mark}), flush=True)


def bulk(ip: str, port: int, seconds: float) -> None:
    s = socket.create_connection((ip, port))
    t0 = time.monotonic()
    view = memoryview(ZEROS)
    while time.monotonic() - t0 < seconds:
        s.sendall(view)
    s.close()


def pipe_server(port: int, n: int, count: int, window: int) -> None:
    """Receive `count` messages striped over `n` connections with the workers' own reader (each connection's
    window clamped to `window` as the workers do); print each message's [sender's start, last chunk in]."""
    import threading

    from testbed.runtime.worker import Inbox, reader

    lst = socket.create_server(("0.0.0.0", port), backlog=n)
    print("ready", flush=True)
    inbox = Inbox()
    socks = []
    for _ in range(n):
        c, _ = lst.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(c)
    threading.Thread(target=reader, args=(socks, inbox, window), daemon=True).start()
    out = [list(inbox.wait((b"a", 0, i))) for i in range(count)]
    print(json.dumps(out), flush=True)


def _striped_pipe(ip: str, port: int, n: int):
    """`n` connections to the peer, as the workers' striped pipe (the workers' own sender)."""
    from testbed.runtime.worker import Striped

    socks = []
    for _ in range(n):
        s = socket.create_connection((ip, port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(s)
    return Striped(socks)


def pipe_client(ip: str, port: int, n: int, nbytes: int, count: int, gap_s: float) -> None:
    """Send `count` messages of `nbytes` striped over `n` connections with the workers' own sender, `gap_s`
    apart (each after the previous one left)."""
    import threading

    pipe = _striped_pipe(ip, port, n)
    for i in range(count):
        done = threading.Event()
        pipe.send(b"a", 0, i, nbytes, lambda a, b, d=done: d.set())
        done.wait()
        time.sleep(gap_s)
    time.sleep(1.0)  # let the last bytes arrive before the sockets close


def pipe_backlog(ip: str, port: int, n: int, nbytes: int, count: int, rounds: int, gap_s: float) -> None:
    """A backlog: `count` messages queued on the pipe at once (as a pipeline stage's sends queue behind a slow
    link), `rounds` times, `gap_s` apart (the link drains in between); message r * count + i of round r."""
    import threading

    pipe = _striped_pipe(ip, port, n)
    left = threading.Semaphore(0)
    for r in range(rounds):
        for i in range(count):
            pipe.send(b"a", 0, r * count + i, nbytes, lambda a, b: left.release())
        for _ in range(count):
            left.acquire()
        time.sleep(gap_s)
    time.sleep(1.0)  # let the last bytes arrive before the sockets close


if __name__ == "__main__":
    mode, *a = sys.argv[1:]
    if mode == "server":
        server(int(a[0]), *map(int, a[1:]))
    elif mode == "messages":
        messages(a[0], int(a[1]), int(a[2]), int(a[3]), float(a[4]))
    elif mode == "pipe-server":
        pipe_server(int(a[0]), int(a[1]), int(a[2]), int(a[3]))
    elif mode == "pipe-client":
        pipe_client(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), float(a[5]))
    elif mode == "pipe-backlog":
        pipe_backlog(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), int(a[5]), float(a[6]))
    elif mode == "sink":
        sink(int(a[0]), float(a[1]), *map(int, a[2:]))
    else:
        bulk(a[0], int(a[1]), float(a[2]))

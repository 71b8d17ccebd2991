"""A small Unix-socket server for control frames (length-prefixed JSON, see wire.py), shared by
the Atlas sidecar and the BubbleTea service. One process, one selector, no threads. A malformed
frame gets an error reply (when replies are on) and closes only that client's connection; a client
that is not one of the run's users is refused before it can send anything (access.py)."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import sys
from collections.abc import Callable

from testbed.runtime.access import listen_unix, log, refusal
from testbed.runtime.wire import CTRL_LEN, MAX_CTRL, ProtocolError, parse_ctrl, send_ctrl


class Client:
    """Buffers bytes from one connection and yields complete, bounded frames."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, bytearray()

    def frames(self):
        while len(self.buf) >= CTRL_LEN.size:
            (n,) = CTRL_LEN.unpack_from(self.buf)
            if n > MAX_CTRL:
                raise ProtocolError(f"frame of {n} bytes")
            if len(self.buf) < CTRL_LEN.size + n:
                return
            body = bytes(self.buf[CTRL_LEN.size:CTRL_LEN.size + n])
            del self.buf[:CTRL_LEN.size + n]
            yield parse_ctrl(body)


def serve_frames(path: str, handle: Callable[[dict], dict | None], name: str, *, gid: int | None = None,
                 peer_uids: list[int] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; `handle` returns a reply (sent back) or None. Prints `ready` once
    listening. The socket is 0660 with group `gid` (see access.py); a client whose uid is not in
    `peer_uids` (default: this process's own) or root is refused at once, with a line on stderr.
    Returns how many connections were closed for malformed frames or refused."""
    running = [True]
    signal.signal(signal.SIGTERM, lambda *_: running.__setitem__(0, False))
    signal.signal(signal.SIGINT, lambda *_: running.__setitem__(0, False))
    uids = set(peer_uids if peer_uids is not None else [os.getuid()])
    srv = listen_unix(path, gid)
    srv.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ, None)
    print("ready", flush=True)
    rejected = 0
    while running[0]:
        for key, _ in sel.select(timeout=0.5):  # finite, so SIGTERM is honoured
            if key.data is None:
                c, _ = srv.accept()
                why = refusal(c, uids, name)
                if why:
                    rejected += 1
                    log(why)
                    c.close()
                    continue
                sel.register(c, selectors.EVENT_READ, Client(c))
                continue
            cl: Client = key.data
            try:
                data = cl.sock.recv(65536)
                if not data:
                    raise ConnectionError("closed")
                cl.buf += data
                for msg in cl.frames():
                    reply = handle(msg)
                    if reply is not None:
                        send_ctrl(cl.sock, reply)
            except (ProtocolError, KeyError, TypeError, ValueError) as e:
                rejected += 1
                print(f"{name}: rejected a message ({e}); closing that connection", file=sys.stderr, flush=True)
                with contextlib.suppress(OSError):
                    send_ctrl(cl.sock, {"error": str(e)})
                sel.unregister(cl.sock)
                cl.sock.close()
            except OSError:
                sel.unregister(cl.sock)
                cl.sock.close()
    srv.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return rejected

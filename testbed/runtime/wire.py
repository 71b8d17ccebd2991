"""Wire formats. Data: a fixed header per chunk, then the payload. Control: length-prefixed JSON.

Data header (network order): kind (1 byte: b'a' activation, b'g' gradient, b'r' ring all-reduce),
iteration (u32), microbatch (u32; with virtual stages the receiver's model chunk above bit 20,
runtime/worker.py wire_mb), chunk (u16), chunks (u16), payload bytes (u64), the whole
message's bytes (u64), sender's monotonic send time (f64), on the orchestrator's clock. Chunk i of a
message of T bytes striped over n connections starts at offset i*(T//n) + min(i, T%n). Every host of one
machine shares CLOCK_MONOTONIC (one kernel); on a cluster of servers with their own clocks the sender subtracts
its machine's offset and the receiver adds its own (runtime/worker.py Striped, Inbox; testbed/cluster/clock.py),
so times compare directly.

Control: u32 length, then a UTF-8 JSON object of at most 16 MiB. A malformed frame raises
ProtocolError; a reader never trusts a length it has not bounded.
"""

from __future__ import annotations

import json
import socket
import struct

DATA = struct.Struct("!cIIHHQQd")


def chunk_sizes(total: int, n: int) -> list[int]:
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


def chunk_offset(total: int, n: int, i: int) -> int:
    return i * (total // n) + min(i, total % n)
CTRL_LEN = struct.Struct("!I")
MAX_CTRL = 16 * 2**20


class ProtocolError(ValueError):
    pass


def recv_exact(sock: socket.socket, n: int, buf: bytearray | None = None) -> memoryview:
    view = memoryview(buf if buf is not None and len(buf) >= n else bytearray(n))[:n]
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return view


def send_ctrl(sock: socket.socket, obj: dict) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(CTRL_LEN.pack(len(body)) + body)


def recv_ctrl(sock: socket.socket, limit: int = MAX_CTRL) -> dict:
    (n,) = CTRL_LEN.unpack(recv_exact(sock, CTRL_LEN.size))
    if n > limit:
        raise ProtocolError(f"control frame of {n} bytes exceeds {limit}")
    return parse_ctrl(bytes(recv_exact(sock, n)))


def parse_ctrl(body: bytes) -> dict:
    """A control frame's body as its JSON object; ProtocolError if it is none."""
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ProtocolError(f"control frame is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("control frame is not a JSON object")
    return obj


DRAIN_BYTES = 64 * 1024


def recv_ctrl_skipping(sock: socket.socket, reject, limit: int = MAX_CTRL) -> dict:
    """The next well-formed control frame from `sock`. A frame that is not a JSON object, or longer than `limit`
    (its bytes read and dropped DRAIN_BYTES at a time, never held), is rejected, `reject(why)` is called, and
    reading goes on: a peer's bad message costs the message, not the connection (the frame boundaries hold)."""
    while True:
        (n,) = CTRL_LEN.unpack(recv_exact(sock, CTRL_LEN.size))
        if n > limit:
            buf = bytearray(DRAIN_BYTES)
            left = n
            while left:
                left -= len(recv_exact(sock, min(left, DRAIN_BYTES), buf))
            reject(f"control frame of {n} bytes exceeds {limit}")
            continue
        try:
            return parse_ctrl(bytes(recv_exact(sock, n)))
        except ProtocolError as e:
            reject(str(e))

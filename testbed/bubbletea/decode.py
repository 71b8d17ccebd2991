"""A decode process in a DC (BubbleTea's disaggregated decode pool, one process per DC): it receives
KV caches that workers' prefills shipped over the emulated WAN, decodes a few tokens from each with
the same small Llama-style model (same weights: same shape and seed), and tells the BubbleTea service
when each request's KV cache and first token arrived (the end of its end-to-end TTFT).

Wire: per request a control frame {"request", "first", "tokens", "bytes", "t_send"}, then `bytes`
bytes of float32 K and V per layer (testbed/runtime/tiny_llama.py's layout), or with `"compute":
"modeled"` (`bubbletea.ship_kv`) `bytes` of filler, the modeled cache's size over the emulation's scale,
received, timed and reported, with nothing decoded; such a cache may come in `parts` parts on as many
connections, and is in when its last part is. Once a part is all in, one byte back (the sender's receipt:
testbed/bubbletea/worker_side.py KvShipper).

Usage: python -m testbed.bubbletea.decode CONFIG.json   (prints `ready` once listening)
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

from testbed.runtime.lowcpu import lowest_cpu_priority
from testbed.runtime.wire import recv_ctrl, recv_exact, send_ctrl


def _decoder(cfg: dict):
    """(first token, KV bytes, prompt tokens) -> decoded tokens, with the small Llama-style model."""
    import torch

    from testbed.costs.models import MODELS
    from testbed.runtime.tiny_llama import TinyLlama, kv_from_bytes

    torch.set_num_threads(1)
    m = MODELS[cfg["model"]]
    net = TinyLlama(m)

    def decode(first: int, data, tokens: int) -> list[int]:
        return net.decode(first, kv_from_bytes(data, m, tokens), cfg["decode_tokens"])

    return decode


def discard(c: socket.socket, n: int, buf: bytearray) -> None:
    """Receive `n` bytes of filler into a reused buffer."""
    view = memoryview(buf)
    while n > 0:
        got = c.recv_into(view, min(n, len(buf)))
        if not got:
            raise ConnectionError("closed mid-cache")
        n -= got


def serve(cfg: dict) -> None:
    """compute `torch` (the default): decode from the real cache; `modeled`: the cache is filler, received and
    timed, nothing decoded."""
    decode = _decoder(cfg) if cfg.get("compute", "torch") == "torch" else None
    if decode is None:  # receive-only: it moves KV caches and nothing else
        lowest_cpu_priority(whole_process=True)
    lock = threading.Lock()  # one decode at a time: one CPU thread, like one GPU
    svc = socket.socket(socket.AF_UNIX)
    svc.connect(cfg["service"])
    svc_lock = threading.Lock()
    parts_in: dict[int, int] = {}  # request -> parts of its filler cache in so far
    parts_lock = threading.Lock()

    def report(head: dict, t_kv: float, t_done: float, tokens: int) -> None:
        with svc_lock:
            send_ctrl(svc, {"op": "decoded", "request": int(head["request"]), "t_send": head["t_send"],
                            "t_kv": t_kv, "t_done": t_done, "tokens": tokens, "dc": cfg["dc"]})
            recv_ctrl(svc)

    def client(c: socket.socket) -> None:
        buf = bytearray(1 << 20)
        try:
            while True:
                head = recv_ctrl(c)
                if decode is None:
                    discard(c, int(head["bytes"]), buf)
                    t_kv = time.monotonic()
                    rid = int(head["request"])
                    with parts_lock:
                        parts_in[rid] = parts_in.get(rid, 0) + 1
                        last = parts_in[rid] == int(head.get("parts", 1))
                    if last:
                        report(head, t_kv, t_kv, 0)  # in the service's record before the sender's receipt
                    c.sendall(b"\x01")
                    continue
                data = recv_exact(c, int(head["bytes"]))
                t_kv = time.monotonic()
                c.sendall(b"\x01")
                with lock:
                    toks = decode(int(head["first"]), data, int(head["tokens"]))
                report(head, t_kv, time.monotonic(), len(toks))
        except (ConnectionError, OSError):
            c.close()

    lst = socket.create_server((cfg["ip"], cfg["port"]), backlog=64)
    print("ready", flush=True)
    while True:
        c, _ = lst.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=client, args=(c,), daemon=True).start()


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        serve(json.load(f))

"""A decode process in a DC (BubbleTea's disaggregated decode pool, one process per DC): it receives
KV caches that workers' prefills shipped over the emulated WAN, decodes a few tokens from each with
the same small Llama-style model (same weights: same shape and seed), and tells the BubbleTea service
when each request's KV cache and first token arrived (the end of its end-to-end TTFT).

Wire: per request a control frame {"request", "first", "tokens", "bytes", "t_send"}, then `bytes`
bytes of float32 K and V per layer (testbed/runtime/tiny_llama.py's layout).

Usage: python -m testbed.runtime.decode CONFIG.json   (prints `ready` once listening)
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

from testbed.runtime.wire import recv_ctrl, recv_exact, send_ctrl


def serve(cfg: dict) -> None:
    import torch

    from testbed.costs.models import MODELS
    from testbed.runtime.tiny_llama import TinyLlama, kv_from_bytes

    torch.set_num_threads(1)
    m = MODELS[cfg["model"]]
    net = TinyLlama(m)
    lock = threading.Lock()  # one decode at a time: one CPU thread, like one GPU
    svc = socket.socket(socket.AF_UNIX)
    svc.connect(cfg["service"])
    svc_lock = threading.Lock()

    def client(c: socket.socket) -> None:
        try:
            while True:
                head = recv_ctrl(c)
                data = recv_exact(c, int(head["bytes"]))
                t_kv = time.monotonic()
                kv = kv_from_bytes(data, m, int(head["tokens"]))
                with lock:
                    toks = net.decode(int(head["first"]), kv, cfg["decode_tokens"])
                t_done = time.monotonic()
                with svc_lock:
                    send_ctrl(svc, {"op": "decoded", "request": int(head["request"]), "t_send": head["t_send"],
                                    "t_kv": t_kv, "t_done": t_done, "tokens": len(toks), "dc": cfg["dc"]})
                    recv_ctrl(svc)
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

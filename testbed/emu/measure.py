"""Measurements run inside emulated hosts: iperf3 (through its Python wrapper), ping, and bulk transfers over
the training workers' own connections.

`python -m testbed.emu.measure server PORT` serves one iperf3 test and prints its JSON;
`python -m testbed.emu.measure client HOST PORT SECONDS STREAMS` runs one and prints JSON.
`python -m testbed.emu.measure bulk-server IP PORT CONNECTIONS WINDOW WARMUP_S SECONDS [CLOCK_S]` receives one bulk
run and prints its goodput; `bulk-client HOST PORT CONNECTIONS WINDOW WARMUP_S SECONDS [CLOCK_S]` sends it (CLOCK_S:
the machine's clock minus the orchestrator's, where the two ends run on servers with their own clocks). Both ends
set their connections up with the workers' own functions (runtime/worker.py `connect`, `listen`, `accept`, `reader`,
`Striped`): a fixed receive buffer for the window WINDOW (bytes) and the window clamped to it, re-applied after
each message; iperf3 cannot clamp a window, so its connections get the kernel's autotuned one.
"""

from __future__ import annotations

import json
import re
import statistics
import struct
import sys
import time

PING_RE = re.compile(r"time=([0-9.]+) ms")
BULK_DEPTH = 3  # messages a bulk sender keeps queued, so its connections never wait for the next one
BULK_TAIL_S = 0.5  # a bulk sender goes on this long after the receiver's measurement ends
RTT_SAMPLE_S = 0.02  # how often a bulk sender reads its connections' smoothed RTT
TCPI_RTT = struct.Struct("I")  # struct tcp_info's tcpi_rtt (microseconds), after 8 u8s and 13 u32s (linux/tcp.h)
TCPI_RTT_OFFSET = 68


def iperf_server(port: int) -> dict:
    import iperf3

    s = iperf3.Server()
    s.port = port
    s.json_output = True
    r = s.run()
    return {"error": getattr(r, "error", None)}


def iperf_client(host: str, port: int, seconds: float, streams: int, retry_s: float = 10.0) -> dict:
    import iperf3

    deadline = time.monotonic() + retry_s
    while True:
        c = iperf3.Client()
        c.server_hostname, c.port, c.duration, c.num_streams = host, port, int(max(1, seconds)), streams
        c.json_output = True
        r = c.run()
        err = getattr(r, "error", None)
        if not err:
            return {"sent_mbps": r.sent_Mbps, "received_mbps": r.received_Mbps, "retransmits": r.retransmits,
                    "streams": streams}
        if time.monotonic() > deadline or "connect" not in err.lower():
            return {"error": err}
        time.sleep(0.2)  # the server in the other namespace is not listening yet


def bulk_message_bytes(connections: int, window: int) -> int:
    """One bulk message: a window per connection (each connection's chunk is one window, so the workers' reader
    re-applies the clamp once per window, and a second's run completes many messages)."""
    return connections * max(window, 64 * 1024)


def goodput(arrivals: list[float], message_bytes: int, t_from: float, t_to: float) -> dict:
    """Goodput between the first and the last message completed in [t_from, t_to]: the messages after the first,
    over the time between the two (exact, whatever the message size; the run's edges are left out)."""
    inside = sorted(t for t in arrivals if t_from <= t <= t_to)
    if len(inside) < 2:
        return {"error": f"{len(inside)} message(s) completed in the {t_to - t_from:g} s measured; need 2 "
                         f"(raise multitcp.seconds)"}
    dur = inside[-1] - inside[0]
    nbytes = (len(inside) - 1) * message_bytes
    return {"received_mbps": nbytes * 8 / dur / 1e6, "measured_s": dur, "bytes": nbytes, "messages": len(inside)}


def tcp_rtt_s(sock) -> float:
    """The kernel's smoothed round-trip time of a TCP connection (TCP_INFO), in seconds."""
    import socket

    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCPI_RTT_OFFSET + TCPI_RTT.size)
    return TCPI_RTT.unpack_from(info, TCPI_RTT_OFFSET)[0] / 1e6


def bulk_server(ip: str, port: int, connections: int, window: int, warmup_s: float, seconds: float,
                clock_s: float = 0.0) -> dict:
    """Accept `connections` from a bulk client and read them with the workers' reader until the client closes;
    the goodput of the `seconds` after `warmup_s` from the client's first send."""
    from testbed.runtime.worker import Inbox, accept, listen, reader

    lst = listen(ip, port, window)
    accepted = [accept(lst) for _ in range(connections)]
    lst.close()
    message = int(accepted[0][1]["message_bytes"])
    inbox = Inbox(clock_s=clock_s)  # the client's send times on this machine's clock
    starts: list[float] = []
    arrivals: list[float] = []

    def arrived(key: tuple) -> None:
        t_send, t_in = inbox.wait(key)  # it is in: this returns at once, and drops it
        starts.append(t_send)
        arrivals.append(t_in)

    inbox.on_complete = arrived
    reader([c for c, _ in accepted], inbox, window)  # returns when the client closes
    if not starts:
        return {"error": "no message arrived"}
    t0 = min(starts)
    return {**goodput(arrivals, message, t0 + warmup_s, t0 + warmup_s + seconds), "connections": connections,
            "window": window, "warmup_s": warmup_s}


def bulk_client(host: str, port: int, connections: int, window: int, warmup_s: float, seconds: float,
                clock_s: float = 0.0, retry_s: float = 10.0) -> dict:
    """Open `connections` to a bulk server as a worker opens its pipe's, and stripe messages over them (the
    workers' sender) for the warm-up, the measured seconds and a tail; then close."""
    import threading

    from testbed.runtime.worker import Inbox, Striped, connect, reader

    message = bulk_message_bytes(connections, window)
    deadline = time.monotonic() + retry_s
    socks = [connect(host, port, {"group": "bulk", "purpose": "pipe", "message_bytes": message}, deadline, window)
             for _ in range(connections)]
    # as on a worker, a reader serves the connections it opened (nothing comes back here)
    threading.Thread(target=reader, args=(socks, Inbox(), window), daemon=True).start()
    pipe = Striped(socks, clock_s=clock_s)
    room = threading.Semaphore(BULK_DEPTH)
    t0 = time.monotonic()
    stop = t0 + warmup_s + seconds + BULK_TAIL_S
    rtts: list[float] = []

    def sample_rtt() -> None:
        """The round trip the data saw in the measured seconds (the emulated link's, queueing included)."""
        time.sleep(warmup_s)
        while time.monotonic() < t0 + warmup_s + seconds:
            rtts.extend(tcp_rtt_s(s) for s in socks)
            time.sleep(RTT_SAMPLE_S)

    sampler = threading.Thread(target=sample_rtt, daemon=True)
    sampler.start()
    sent = 0
    while time.monotonic() < stop:
        room.acquire()
        pipe.send(b"a", 0, sent, message, lambda *_: room.release())
        sent += 1
    for _ in range(BULK_DEPTH):  # the last messages are in the socket buffers
        room.acquire()
    sampler.join()
    for s in socks:
        s.close()
    return {"messages": sent, "message_bytes": message, "tcp_rtt_ms": statistics.fmean(rtts) * 1e3 if rtts else None}


def ping_stats(output: str) -> dict:
    rtts = sorted(float(x) for x in PING_RE.findall(output))
    if not rtts:
        return {"rtt_min_ms": None, "rtt_avg_ms": None, "rtt_p99_ms": None, "samples": 0}
    p99 = rtts[min(len(rtts) - 1, int(round(0.99 * (len(rtts) - 1))))]
    return {"rtt_min_ms": rtts[0], "rtt_avg_ms": statistics.fmean(rtts), "rtt_p99_ms": p99, "samples": len(rtts)}


def main() -> None:
    cmd, *args = sys.argv[1:]
    if cmd == "server":
        out = iperf_server(int(args[0]))
    elif cmd == "client":
        out = iperf_client(args[0], int(args[1]), float(args[2]), int(args[3]))
    elif cmd in ("bulk-server", "bulk-client"):
        run = bulk_server if cmd == "bulk-server" else bulk_client
        out = run(args[0], int(args[1]), int(args[2]), int(args[3]), float(args[4]), float(args[5]),
                  clock_s=float(args[6]) if len(args) > 6 else 0.0)
    else:
        raise SystemExit("usage: measure server PORT | client HOST PORT SECONDS STREAMS | "
                         "bulk-server IP PORT CONNECTIONS WINDOW WARMUP_S SECONDS [CLOCK_S] | "
                         "bulk-client HOST PORT CONNECTIONS WINDOW WARMUP_S SECONDS [CLOCK_S]")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

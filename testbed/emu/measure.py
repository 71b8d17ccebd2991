"""Measurements run inside emulated hosts: iperf3 (through its Python wrapper) and ping.

`python -m testbed.emu.measure server PORT` serves one iperf3 test and prints its JSON;
`python -m testbed.emu.measure client HOST PORT SECONDS STREAMS` runs one and prints JSON.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time

PING_RE = re.compile(r"time=([0-9.]+) ms")


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
    else:
        raise SystemExit("usage: measure server PORT | client HOST PORT SECONDS STREAMS")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

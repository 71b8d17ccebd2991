"""`topology check`: measure every WAN pair (RTT by ping, TCP throughput by iperf3) against its spec."""

from __future__ import annotations

import json
import subprocess
import sys

from testbed.costs.tcp import striped_rate
from testbed.emu.build import Emulation
from testbed.emu.measure import ping_stats
from testbed.emu.sh import EmuError

LINKS_HEADER = ("link", "configured_mbps", "measured_mbps_1", "measured_mbps_n", "streams", "model_mbps_1",
                "configured_rtt_ms", "rtt_min_ms", "rtt_avg_ms", "rtt_p99_ms", "delay_method", "scale", "window_kib")


def ping(emu: Emulation, src: str, dst_ip: str, count: int) -> dict:
    out = emu.backend.run(emu.host_node(src), ["ping", "-n", "-c", str(count), "-i", "0.05", "-W", "2", dst_ip],
                          check=False, timeout=count * 0.5 + 10)
    return ping_stats(out)


def iperf(emu: Emulation, src: str, dst: str, port: int, seconds: float, streams: int) -> dict:
    be = emu.backend
    server = be.popen(emu.host_node(dst), [sys.executable, "-m", "testbed.emu.measure", "server", str(port)],
                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        out = be.run(emu.host_node(src), [sys.executable, "-m", "testbed.emu.measure", "client",
                                          emu.addr.host(dst).ip, str(port), str(seconds), str(streams)],
                     timeout=seconds + 30)
        res = json.loads(out.strip().splitlines()[-1])
    finally:
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if res.get("error"):
        raise EmuError(f"iperf3 {src} -> {dst}: {res['error']}")
    return res


def bulk(emu: Emulation, src: str, dst: str, port: int, seconds: float, connections: int, window: int,
         warmup_s: float) -> dict:
    """Goodput of `connections` set up as the training workers' WAN connections (window clamped to `window`
    bytes) from host `src` to `dst`, over `seconds` after a `warmup_s` that is left out
    (`python -m testbed.emu.measure bulk-server|bulk-client`)."""
    be, ip = emu.backend, emu.addr.host(dst).ip
    args = [str(port), str(connections), str(window), f"{warmup_s:g}", f"{seconds:g}"]
    server = be.popen(emu.host_node(dst), [sys.executable, "-m", "testbed.emu.measure", "bulk-server", ip, *args],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sent = be.run(emu.host_node(src), [sys.executable, "-m", "testbed.emu.measure", "bulk-client", ip, *args],
                      timeout=warmup_s + seconds + 30)
        out, err = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    lines = out.strip().splitlines()
    if server.returncode != 0 or not lines:
        raise EmuError(f"bulk receiver {dst} failed: {(err.strip().splitlines() or ['no output'])[-1]}")
    res = json.loads(lines[-1])
    if res.get("error"):
        raise EmuError(f"bulk {src} -> {dst}: {res['error']}")
    return {**res, "tcp_rtt_ms": json.loads(sent.strip().splitlines()[-1])["tcp_rtt_ms"]}


def check_links(emu: Emulation, streams: int = 8, seconds: float = 3.0, pings: int = 40) -> list[dict]:
    rows = []
    for k, link in enumerate(emu.topo.links):
        a, b = link.between
        src, dst = f"{a}-h0", f"{b}-h0"
        rtt = ping(emu, src, emu.addr.host(dst).ip, pings)
        one = iperf(emu, src, dst, 5201 + k, seconds, 1)
        many = iperf(emu, src, dst, 5201 + k, seconds, streams)
        cap = link.gbps * 1e3 / emu.scale
        win = emu.window_bytes(a, b)
        rtt_s = 2 * link.latency_ms / 1e3
        rows.append({
            "link": f"{a}-{b}", "configured_mbps": round(cap, 3),
            "measured_mbps_1": round(one["received_mbps"], 3), "measured_mbps_n": round(many["received_mbps"], 3),
            "streams": streams, "model_mbps_1": round(striped_rate(cap * 1e6 / 8, 1, win, rtt_s) * 8 / 1e6, 3),
            "configured_rtt_ms": 2 * link.latency_ms, **{k2: (round(v, 3) if v is not None else "") for k2, v in
                                                        rtt.items() if k2 != "samples"},
            "delay_method": emu.delay, "scale": emu.scale, "window_kib": round(win / 1024, 1),
        })
    return rows

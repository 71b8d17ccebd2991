"""`topology check`: measure every WAN pair against its spec: RTT by ping, TCP throughput by iperf3 and by the
training workers' own transport (window-clamped connections, striped and corked sends: `bulk`), the latter
against the window model min(C, n W / RTT), with the RTT TCP itself measured on the path during the transfer (on a
loaded machine the path's RTT grows past the configured one, and a window-bound transfer slows with it)."""

from __future__ import annotations

import json
import subprocess
import sys

from testbed.costs.tcp import striped_rate
from testbed.emu.build import Emulation
from testbed.emu.measure import ping_stats
from testbed.emu.sh import EmuError
from testbed.net.units import bytes_s_to_mbps, bytes_to_kib, mbps_to_bytes_s

LINKS_HEADER = ("link", "configured_mbps", "measured_mbps_1", "measured_mbps_n", "workers_mbps_1", "workers_mbps_n",
                "streams", "model_mbps_1", "model_mbps_n", "configured_rtt_ms", "rtt_min_ms", "rtt_avg_ms",
                "rtt_p99_ms", "workers_rtt_ms_1", "workers_rtt_ms_n", "delay_method", "scale", "window_kib")


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
    (`python -m testbed.emu.measure bulk-server|bulk-client`). Each end is told its machine's clock against ours (a
    cluster's servers have their own): the server measures from the client's send times."""
    be, ip = emu.backend, emu.addr.host(dst).ip
    args = [str(port), str(connections), str(window), f"{warmup_s:g}", f"{seconds:g}"]
    clock = {h: [repr(be.clock_offset_s(emu.host_node(h)))] for h in (src, dst)}
    server = be.popen(emu.host_node(dst), [sys.executable, "-m", "testbed.emu.measure", "bulk-server", ip, *args,
                                           *clock[dst]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sent = be.run(emu.host_node(src), [sys.executable, "-m", "testbed.emu.measure", "bulk-client", ip, *args,
                                           *clock[src]],
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


MODEL_SHARE = 0.9  # a link whose workers' throughput reads under this share of its model gets a warning
WORKERS_WARMUP_S = 1.0  # left out of the workers' measurement: their connections' slow start


def check_links(emu: Emulation, streams: int = 8, seconds: float = 3.0, pings: int = 40) -> list[dict]:
    """One links.csv row per WAN link: ping, iperf3 and the workers' transport with 1 and `streams` connections."""
    rows = []
    for k, link in enumerate(emu.net.links):
        a, b = link.between
        e = emu.link(a, b)
        src, dst = f"{a}-h0", f"{b}-h0"
        rtt = ping(emu, src, emu.addr.host(dst).ip, pings)
        one = iperf(emu, src, dst, 5201 + k, seconds, 1)
        many = iperf(emu, src, dst, 5201 + k, seconds, streams)
        cap, win, rtt_s = bytes_s_to_mbps(e.capacity_bytes_s), e.window_bytes, e.rtt_s
        ours = {n: bulk(emu, src, dst, 5301 + k, seconds, n, win, WORKERS_WARMUP_S) for n in (1, streams)}
        model = {n: bytes_s_to_mbps(striped_rate(mbps_to_bytes_s(cap), n, win, rtt_s)) for n in (1, streams)}
        rows.append({
            "link": f"{a}-{b}", "configured_mbps": round(cap, 3),
            "measured_mbps_1": round(one["received_mbps"], 3), "measured_mbps_n": round(many["received_mbps"], 3),
            "workers_mbps_1": round(ours[1]["received_mbps"], 3),
            "workers_mbps_n": round(ours[streams]["received_mbps"], 3),
            "streams": streams, "model_mbps_1": round(model[1], 3), "model_mbps_n": round(model[streams], 3),
            "configured_rtt_ms": 2 * e.delay_ms, **{k2: (round(v, 3) if v is not None else "") for k2, v in
                                                        rtt.items() if k2 != "samples"},
            "workers_rtt_ms_1": round(ours[1]["tcp_rtt_ms"], 3),
            "workers_rtt_ms_n": round(ours[streams]["tcp_rtt_ms"], 3),
            "delay_method": emu.delay, "scale": emu.scale, "window_kib": round(bytes_to_kib(win), 1),
        })
    return rows


def model_at_rtt_mbps(row: dict, connections: int, rtt_ms: float) -> float:
    """The window model of a links.csv row at another RTT: min(capacity, n W / RTT)."""
    window_mbit = bytes_s_to_mbps(float(row["window_kib"]) * 1024)
    return min(float(row["configured_mbps"]), connections * window_mbit / (rtt_ms / 1e3))


def below_model(rows: list[dict], share: float = MODEL_SHARE) -> list[str]:
    """One line per link whose workers' throughput, on 1 or on n connections, is under `share` of its model, naming
    the cause: the path's RTT as TCP measured it (the transport gets the model at that RTT: the path is slower than
    configured), or the transport itself (it falls short of the model even at that RTT)."""
    lines = []
    for r in rows:
        misses, path_slow = [], True
        for n, col in ((1, "1"), (r["streams"], "n")):
            got, model = float(r[f"workers_mbps_{col}"]), float(r[f"model_mbps_{col}"])
            if got < share * model:
                rtt = float(r[f"workers_rtt_ms_{col}"])
                at_rtt = model_at_rtt_mbps(r, n, rtt)
                path_slow = path_slow and got >= share * at_rtt
                misses.append(f"{got:.1f} Mbit/s on {n} connection(s), {got / model:.1%} of the model's {model:.1f} "
                              f"(TCP measured an RTT of {rtt:.1f} ms, the model there {at_rtt:.1f})")
        if misses:
            why = (f"the path's RTT is longer than the configured {float(r['configured_rtt_ms']):g} ms (a loaded "
                   f"machine, or a delay line that cannot keep up)" if path_slow else
                   "the transport falls short of the model even at the RTT it measured")
            lines.append(f"{r['link']}: the workers' transport gets {' and '.join(misses)}: this link is slower than "
                         f"the simulator assumes: {why}")
    return lines

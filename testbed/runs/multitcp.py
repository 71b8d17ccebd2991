"""The multi-TCP experiment: throughput of one WAN link vs the number of parallel TCP connections,
measured on the emulated WAN and predicted by the simulator's model, side by side.

`emu` rows: the training workers' own connections (emu/check.py `bulk`: window clamped to the link's
emulated window, the simulator's W), after a warm-up. `emu-iperf3` rows: iperf3, whose connections get
the kernel's autotuned window (unclamped, from the hosts' buffer sysctls) and whose run includes slow start.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from testbed.emu.build import down, up
from testbed.emu.check import bulk, iperf, ping
from testbed.emu.scale import auto_scale, check_scale
from testbed.net.links import NetLink
from testbed.net.units import bytes_s_to_mbps
from testbed.plan.synthetic import make_plan
from testbed.results import write_csv
from testbed.sim.executor import simulate
from testbed.spec.experiment import Experiment

HEADER = ("run_id", "source", "experiment", "link", "wan_latency_ms", "wan_mbps", "tcp_connections", "window_kib",
          "throughput_mbps", "rtt_avg_ms", "tcp_rtt_ms", "scale", "delay_method", "sweep")


def sim_throughput_mbps(link: NetLink, n: int, emulated_bytes: float = 1e9) -> float:
    """The simulator's answer, in emulated Mbit/s: one long transfer (`emulated_bytes` on the emulated link, k times
    as many in the real world) over n connections on the link as built, alone. The plan is in real-world units."""
    k = link.emulated.scale if link.emulated is not None else 1.0
    nbytes = emulated_bytes * k
    plan = make_plan(pp=2, m=1, f=0.0, b=0.0, dcs=["a", "b"], act_bytes=nbytes, capacity=link.capacity_bytes_s,
                     latency=link.latency_s, window=link.window_bytes, connections=n)
    tl, _ = simulate(plan)
    send = next(iv for iv in tl.intervals if iv.kind == "send")
    return bytes_s_to_mbps(nbytes / send.dur) / k


def run_point(exp: Experiment, index: int, sweep: dict, progress: Callable[[str], None]) -> list[dict]:
    mt, em = exp.multitcp, exp.emulation
    assert mt is not None
    scale = em.scale or auto_scale(exp.topology)
    check_scale(exp.topology, scale)
    emu = up(exp.topology, backend=em.backend, prefix=em.prefix, scale=scale, delay=em.delay,
             **exp.network.host_tcp)  # the hosts' TCP as the training runs set it
    rows = []
    try:
        for li in mt.links or [0]:
            link = emu.net.links[li]
            a, b = link.between
            e = emu.link(a, b)
            rtt = ping(emu, f"{a}-h0", emu.addr.host(f"{b}-h0").ip, 20)
            cap, win = bytes_s_to_mbps(e.capacity_bytes_s), e.window_bytes
            for n in mt.connections:
                progress(f"{a}-{b} {e.delay_ms:g} ms, {n} connection(s)")
                ours = bulk(emu, f"{a}-h0", f"{b}-h0", 5301, mt.seconds, n, win, mt.warmup_s)
                plain = iperf(emu, f"{a}-h0", f"{b}-h0", 5201, mt.seconds, n)
                base = {"experiment": exp.name, "link": f"{a}-{b}", "wan_latency_ms": e.delay_ms,
                        "wan_mbps": round(cap, 3), "tcp_connections": n, "window_kib": round(win / 1024, 1),
                        "scale": scale, "delay_method": emu.delay,
                        "sweep": ";".join(f"{k}={v}" for k, v in sweep.items())}
                rid = f"p{index:02d}-{a}-{b}-n{n}"
                for source, meas in (("emu", ours), ("emu-iperf3", plain)):
                    rows.append({"run_id": rid, "source": source, **base,
                                 "throughput_mbps": round(meas["received_mbps"], 3),
                                 "rtt_avg_ms": round(rtt["rtt_avg_ms"] or 0.0, 3),
                                 "tcp_rtt_ms": round(meas.get("tcp_rtt_ms") or 0.0, 3) or ""})
                rows.append({"run_id": rid, "source": "sim", **base,
                             "throughput_mbps": round(sim_throughput_mbps(link, n), 3),
                             "rtt_avg_ms": 2 * e.delay_ms, "tcp_rtt_ms": ""})
    finally:
        down(emu)
    return rows


def run_experiment(points: list[tuple[Experiment, dict]], step: Callable[[str], None]) -> list[dict]:
    """Every sweep point, one after the other; `step` is called after each measurement with what it was."""
    rows: list[dict] = []
    for i, (exp, point) in enumerate(points):
        rows += run_point(exp, i, point, step)
    return rows


def measurements(exp: Experiment) -> int:
    """How many measurements one point of `exp` makes (for a progress bar)."""
    assert exp.multitcp is not None
    return len(exp.multitcp.connections) * len(exp.multitcp.links or [0])


def write_experiment(out: Path, rows: list[dict]) -> Path:
    write_csv(out / "summary.csv", HEADER, ([r[c] for c in HEADER] for r in rows))
    return out / "summary.csv"

"""Replica classes on a WAN egress share the link by bytes, not by packets: HTB sends a whole packet per turn
whatever a class's deficit, so with a quantum below the packets (one frame against two-segment packets) a class of
small packets got a turn's worth of them while its sibling sent one large packet per turn (runtime/htb.py
link_quantum). Two flows at once, one in two-segment packets and one clamped to 1000-byte segments, each get
about half the link."""

from __future__ import annotations

import json
import sys

from testbed.emu.build import down, up
from testbed.emu.flowctl import FlowControl
from testbed.runtime.htb import IDLE_PRIO, trickle_bps
from testbed.spec.load import load_topology
from tests.integration.conftest import snapshot, write_topology

LINK_BPS = 100e6
SECONDS = 3.0
PORTS = (7401, 7402)
SMALL_MSS = 1000

RECEIVER = """
import json, socket, sys, threading, time
got = {}
def serve(port):
    s = socket.create_server(("0.0.0.0", port)); c, _ = s.accept(); n, marks = 0, []
    while (d := c.recv(1 << 20)):
        n += len(d); marks.append((time.monotonic(), n))
    got[port] = marks
ts = [threading.Thread(target=serve, args=(int(p),)) for p in sys.argv[1:]]
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps(got))
"""

SENDER = """
import socket, sys, threading, time
ip, secs = sys.argv[1], float(sys.argv[2])
def send(port, mss):
    while True:
        try:
            c = socket.socket()
            if mss:
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, mss)
            c.connect((ip, port)); break
        except OSError:
            time.sleep(0.05)
    buf, end = bytes(1 << 16), time.monotonic() + secs
    while time.monotonic() < end:
        c.sendall(buf)
    c.close()
ts = [threading.Thread(target=send, args=(int(p), int(m))) for p, m in (a.split(":") for a in sys.argv[3:])]
[t.start() for t in ts]; [t.join() for t in ts]
"""


def _bytes_between(marks: list[list[float]], t0: float, t1: float) -> float:
    """Bytes a receiver got between two instants of the shared monotonic clock."""
    before = [n for t, n in marks if t <= t0]
    upto = [n for t, n in marks if t <= t1]
    return (upto[-1] if upto else 0) - (before[-1] if before else 0)


def test_replica_classes_share_a_link_by_bytes_whatever_their_packet_sizes(tmp_path):
    before = snapshot()
    topo = write_topology(tmp_path / "t.yaml", gbps=LINK_BPS / 1e9, latency=2)
    emu = up(load_topology(topo), prefix="gdtbr", scale=1)
    try:
        fc = FlowControl(emu, "east", "west", "west")
        for minor, port in zip((0x20, 0x21), PORTS, strict=True):  # as the replicas' classes on a fair link
            fc.add_class(minor, trickle_bps(LINK_BPS), ceil_bps=LINK_BPS, ports=(port, port), prio=IDLE_PRIO)
        src, dst = emu.host_node("east-h0"), emu.host_node("west-h0")
        rx = emu.backend.popen(dst, [sys.executable, "-c", RECEIVER, *map(str, PORTS)], stdout=-1, text=True)
        emu.backend.run(src, [sys.executable, "-c", SENDER, emu.addr.host("west-h0").ip, str(SECONDS),
                              f"{PORTS[0]}:0", f"{PORTS[1]}:{SMALL_MSS}"], timeout=60)
        marks = {int(k): v for k, v in json.loads(rx.communicate(timeout=60)[0]).items()}
        counters = fc.class_bytes()
        fc.close()
    finally:
        down(emu)
    # the middle of the run, when both flows are backlogged
    start = max(m[0][0] for m in marks.values())
    end = min(m[-1][0] for m in marks.values())
    t0, t1 = start + 0.25 * (end - start), start + 0.75 * (end - start)
    got = {p: _bytes_between(marks[p], t0, t1) for p in PORTS}
    share = got[PORTS[1]] / sum(got.values())
    assert 0.42 < share < 0.58, (share, got)  # by packets the small flow got about a third
    assert sum(got.values()) * 8 / (t1 - t0) > 0.85 * LINK_BPS, got  # and the link stayed busy
    assert counters[0x20] > 0 and counters[0x21] > 0
    assert snapshot() == before

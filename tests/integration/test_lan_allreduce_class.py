"""A host's NIC carries the all-reduce's connections (IP TOS ALLREDUCE_TOS, as the workers mark them) in a class of
their own beside the pipeline's (emu/shaping.py lan_commands): a ring all-reduce and a pipeline message sent at
once each get the NIC's rate, as the simulator gives each transfer inside a DC the fabric's bandwidth alone."""

from __future__ import annotations

import json
import sys

from testbed.emu.build import down, up
from testbed.runtime.htb import ALLREDUCE_MINOR, ALLREDUCE_TOS
from testbed.spec.load import load_topology
from tests.integration.conftest import snapshot

NIC_MBPS = 100.0
SECONDS = 2.0
PORTS = (7301, 7302)

RECEIVER = """
import json, socket, sys, threading
got = {}
def serve(port):
    s = socket.create_server(("0.0.0.0", port)); c, _ = s.accept(); n = 0
    while (d := c.recv(1 << 20)):
        n += len(d)
    got[port] = n
ts = [threading.Thread(target=serve, args=(int(p),)) for p in sys.argv[1:]]
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps(got))
"""

SENDER = """
import socket, sys, threading, time
ip, secs = sys.argv[1], float(sys.argv[2])
def send(port, tos):
    while True:
        try:
            c = socket.socket(); c.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos); c.connect((ip, port)); break
        except OSError:
            time.sleep(0.05)
    buf, end = bytes(1 << 16), time.monotonic() + secs
    while time.monotonic() < end:
        c.sendall(buf)
    c.close()
ts = [threading.Thread(target=send, args=(int(p), int(t, 0))) for p, t in (a.split(":") for a in sys.argv[3:])]
[t.start() for t in ts]; [t.join() for t in ts]
"""


def test_allreduce_and_pipeline_each_get_the_nic(tmp_path):
    before = snapshot()
    topo = tmp_path / "t.yaml"
    topo.write_text(f"""
name: nic
dcs:
  - {{name: east, gpus: 8, hosts: 2, intra_gbps: {NIC_MBPS / 1e3}}}
  - {{name: west, gpus: 8, hosts: 1, intra_gbps: {NIC_MBPS / 1e3}}}
links:
  - {{between: [east, west], gbps: 0.1, latency_ms: 2}}
""")
    emu = up(load_topology(topo), prefix="gdtbu1", scale=1)
    try:
        src, dst = emu.host_node("east-h0"), emu.host_node("east-h1")
        assert emu.lan_rate_bps("east") == NIC_MBPS * 1e6
        rx = emu.backend.popen(dst, [sys.executable, "-c", RECEIVER, *map(str, PORTS)], stdout=-1, text=True)
        emu.backend.run(src, [sys.executable, "-c", SENDER, emu.addr.host("east-h1").ip, str(SECONDS),
                              f"{PORTS[0]}:{ALLREDUCE_TOS:#x}", f"{PORTS[1]}:0"], timeout=30)
        got = {int(k): v for k, v in json.loads(rx.communicate(timeout=30)[0]).items()}
        shown = emu.backend.run(src, ["tc", "-s", "class", "show", "dev", "eth0"])
    finally:
        down(emu)
    mbps = {p: got[p] * 8 / SECONDS / 1e6 for p in PORTS}
    # each near the NIC's rate (one FIFO for both: about half each, NIC_MBPS together)
    assert mbps[PORTS[0]] > 0.8 * NIC_MBPS and mbps[PORTS[1]] > 0.8 * NIC_MBPS, mbps
    assert mbps[PORTS[0]] < 1.1 * NIC_MBPS and mbps[PORTS[1]] < 1.1 * NIC_MBPS, mbps  # and neither above it
    lines = shown.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith(f"class htb 1:{ALLREDUCE_MINOR:x} "))
    sent = int(lines[i + 1].split()[1])  # " Sent N bytes M pkt ..."
    assert sent > 0.8 * got[PORTS[0]], (sent, got)  # the marked connection's bytes went through that class
    assert snapshot() == before

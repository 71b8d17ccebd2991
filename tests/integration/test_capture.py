"""`testbed topology capture`: headers-only scapy capture on the WAN namespaces, 1 ms flows.csv."""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from collections import defaultdict

from tests.conftest import ROOT
from tests.integration.conftest import cli, write_topology


def test_capture_writes_per_flow_ms_bins_that_add_up_to_what_crossed(tmp_path):
    topo = write_topology(tmp_path / "t.yaml", gbps=0.1, latency=5.0, name="cap")
    assert cli("topology", "up", str(topo), "--prefix", "gdtbl8", "--scale", "1").returncode == 0
    try:
        cap = subprocess.Popen([sys.executable, "-m", "testbed", "topology", "capture", "--prefix", "gdtbl8",
                                "--seconds", "4", "--out", str(tmp_path / "flows.csv")], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2.5)  # the capture processes start (scapy's import) before any traffic
        sent = 3_000_000
        server = subprocess.Popen(["ip", "netns", "exec", "gdtbl8-west-h0", sys.executable, "-c",
                                   "import socket\ns = socket.socket(); s.bind(('0.0.0.0', 7101)); s.listen(1)\n"
                                   "c, _ = s.accept()\nwhile c.recv(1 << 20): pass"])
        time.sleep(0.5)
        client = subprocess.run(["ip", "netns", "exec", "gdtbl8-east-h0", sys.executable, "-c",
                                 f"import socket\ns = socket.create_connection(('10.80.1.1', 7101))\n"
                                 f"s.sendall(b'x' * {sent}); s.close()"], timeout=60)
        assert client.returncode == 0
        server.wait(30)
        out, err = cap.communicate(timeout=60)
        assert cap.returncode == 0, err
        assert "kernel drops" in out
    finally:
        cli("topology", "down", "--prefix", "gdtbl8")
    rows = list(csv.DictReader((tmp_path / "flows.csv").read_text().splitlines()))
    data = [x for x in rows if x["dport"] == "7101" and x["towards"] == "west"]
    assert data and {(x["src_dc"], x["dst_dc"], x["replica"]) for x in data} == {("east", "west", "0")}
    total = sum(float(x["bytes"]) for x in data)
    assert sent <= total <= sent * 1.1  # the payload plus headers, each byte counted once (outgoing only)
    per_ms: dict[int, float] = defaultdict(float)
    for x in data:
        per_ms[int(x["t_ms"])] += float(x["bytes"])
    # 100 Mbit/s moves 12.5 kB a millisecond; bins spread each packet over its wire time, so no bin
    # holds much more than the link carries plus its HTB burst (128 KiB)
    assert max(per_ms.values()) < 12_500 + 140_000
    assert len(per_ms) >= sent / 12_500 * 0.8  # about as many busy milliseconds as the transfer needs

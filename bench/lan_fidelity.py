"""Transfers inside an emulated DC against the simulator's model (a message of B bytes takes B / NIC rate):
1 to 6 concurrent host-to-host flows over one DC's bridge, each host's NIC shaped as the emulator shapes it.

The simulator gives every transfer inside a DC its NIC's rate, alone. On a quiet VM the emulated LAN keeps that
rate up to six flows at once; with CPU-bound work beside (`--busy`), long messages fall short, because a connection
inside a DC autotunes its buffer only up to the host's WAN-sized tcp_rmem (`--rcvbuf` fixes it for the probe;
docs/fidelity.md, "Transfers inside a DC"). The ratio printed is measured / modelled time per message (the median
of the last 18 of 20), the round trip of a one-byte reply included.

Flows go both ways between the hosts of a pair (h0 <-> h1, h2 <-> h3, ...), pair after pair, DC after DC.
`--topology FILE` runs on that topology's DCs instead (its own scale: `--scale`).

Needs root. Run: sudo .venv/bin/python bench/lan_fidelity.py [--topology FILE --scale K] [--mbps 400]
[--bytes 198000 1000000] [--flows 1 2 4 6] [--prefix gdtbN]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from testbed.emu.build import down, up
from testbed.spec.load import load_topology
from testbed.spec.topology import Topology

SCALE = 1000.0
PORT = 6100
REPS = 20


def topology(mbps: float, hosts: int) -> Topology:
    """One DC of `hosts` hosts whose NICs run at `mbps` once scaled by SCALE (a second DC: a topology has a link)."""
    return Topology.model_validate({
        "name": "lan", "tcp_window_mb": 16,
        "dcs": [{"name": "a", "gpus": 8 * hosts, "gpus_per_node": 8, "intra_gbps": mbps * SCALE / 1e3, "hosts": hosts},
                {"name": "b", "gpus": 8, "hosts": 1}],
        "links": [{"between": ["a", "b"], "gbps": 0.2 * SCALE, "latency_ms": 5}],
    })


def serve(port: int, rcvbuf: int) -> None:
    """Receive length-prefixed messages; answer each with one byte. `rcvbuf` > 0: a fixed SO_RCVBUF (else the
    host's autotuning, capped by its tcp_rmem, which the emulator sizes for the host's WAN window)."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if rcvbuf > 0:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    print("ready", flush=True)
    c, _ = srv.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(1 << 20)
    while len(hdr := c.recv(8, socket.MSG_WAITALL)) == 8:
        left = int.from_bytes(hdr, "big")
        while left:
            k = c.recv_into(buf, min(len(buf), left))
            if not k:
                return
            left -= k
        c.sendall(b"k")


def send(ip: str, port: int, nbytes: int, start: float) -> None:
    """From wall-clock `start` on, send REPS messages of `nbytes`, each after the last one's reply; print the median."""
    c = socket.create_connection((ip, port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = nbytes.to_bytes(8, "big") + b"x" * nbytes
    while time.time() < start:
        time.sleep(0.001)
    ts = []
    for _ in range(REPS):
        t0 = time.monotonic()
        c.sendall(msg)
        c.recv(1)
        ts.append(time.monotonic() - t0)
    print(statistics.median(ts[2:]), flush=True)


def exec_in(ns: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, __file__, *args], stdout=subprocess.PIPE,
                            text=True, **kw)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("serve", "send"):
        if sys.argv[1] == "serve":
            serve(int(sys.argv[2]), int(sys.argv[3]))
        else:
            send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--mbps", type=float, default=400.0, help="each host's NIC (emulated; bench/fidelity.py: 400)")
    ap.add_argument("--bytes", type=int, nargs="+", default=[198_000, 1_000_000])
    ap.add_argument("--flows", type=int, nargs="+", default=[1, 2, 4, 6])
    ap.add_argument("--topology", type=Path, default=None, help="a topology file (default: one DC, see topology())")
    ap.add_argument("--scale", type=float, default=SCALE, help="with --topology: its scale k")
    ap.add_argument("--rcvbuf", type=int, default=0, help="receivers' fixed SO_RCVBUF (0: the host's autotuning)")
    ap.add_argument("--busy", type=int, default=0, help="CPU-bound processes running beside (a loaded VM)")
    ap.add_argument("--prefix", default=None, help="emulation prefix (default: the first free gdtb<N>)")
    args = ap.parse_args()
    if args.topology is None:
        topo, scale = topology(args.mbps, max(2, max(args.flows) + max(args.flows) % 2)), SCALE
    else:
        topo, scale = load_topology(args.topology), args.scale
    emu = up(topo, prefix=args.prefix, scale=scale)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        pairs = []  # (sender, receiver): both ways in each pair of a DC's hosts
        for dc in topo.dcs:
            hosts = [h for h in emu.addr.hosts if h.dc == dc.name]
            for a, b in zip(hosts[::2], hosts[1::2], strict=False):
                pairs += [(a, b), (b, a)]
        flows = [k for k in args.flows if k <= len(pairs)]
        print(f"ratio = measured / modelled time per message; up to {len(pairs)} flows on this topology")
        for nbytes in args.bytes:
            for k in flows:
                servers = [exec_in(dst.ns, "serve", str(PORT + i), str(args.rcvbuf))
                           for i, (_, dst) in enumerate(pairs[:k])]
                for s in servers:
                    s.stdout.readline()  # type: ignore[union-attr]
                start = f"{time.time() + 1.0:.3f}"
                senders = [exec_in(src.ns, "send", dst.ip, str(PORT + i), str(nbytes), start)
                           for i, (src, dst) in enumerate(pairs[:k])]
                models = [nbytes * 8 / emu.lan_rate_bps(src.dc) for src, _ in pairs[:k]]
                ratios = [float(p.communicate(timeout=120)[0]) / m for p, m in zip(senders, models, strict=True)]
                for s in servers:
                    s.kill()
                    s.wait()
                total = sum(nbytes * 8 / m for m in models) / 1e6
                print(f"{nbytes:>9} B  {k} flow(s) ({total:.0f} Mbit/s in all): ratio median "
                      f"{statistics.median(ratios):.3f}, worst {max(ratios):.3f}", flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
        down(emu)


if __name__ == "__main__":
    main()

"""Seeing the WAN packet by packet: a headers-only scapy capture on every WAN node's interfaces.

One capture process per WAN node runs inside that node's network namespace (`ip netns exec`, or
the backend's equivalent; an observer, so it runs with the testbed's own interpreter on every
backend). On each interface it keeps only packets heading to the DC that interface leads to: on
that interface they are outgoing, so their kernel timestamps are taken after the delay line and the
HTB shaping, when the link really carried them. The BPF filter (compiled by libpcap through scapy)
returns only the first SNAPLEN bytes of each packet: headers only, no payload copied. The capture
is bounded in time and in packets, and counts what the kernel dropped.

Each process bins bytes per flow per millisecond (testbed/analysis/flows.py) and writes them to a
JSON file when it stops (SIGTERM, its time limit, or its packet limit).

Usage (inside a WAN namespace): python -m testbed.emu.capture CONFIG.json
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from testbed.analysis.flows import ETHERNET_HEADER, FlowBins, FlowKey

if TYPE_CHECKING:
    from testbed.emu.build import Emulation

SNAPLEN = 96  # Ethernet (14) + IPv4 (20-60) + TCP with options (20-60) fit; the payload never does
BPF_RET_K = 0x06
PACKET_STATISTICS = 6
DEFAULT_MAX_PACKETS = 2_000_000
SO_RCVBUFFORCE = 33
# A truncated packet still holds its whole buffer in the socket's queue (the kernel trims a clone),
# so the receive buffer is sized for GSO packets: scapy's default loses packets at 200 Mbit/s.
RCVBUF_BYTES = 512 * 2**20


def headers_only_filter(expr: str, snaplen: int = SNAPLEN):
    """libpcap's program for `expr`, with every accepting `ret` cut to snaplen bytes."""
    from scapy.arch.common import compile_filter
    from scapy.data import DLT_EN10MB

    try:
        prog = compile_filter(expr, linktype=DLT_EN10MB)
    except ImportError:
        raise SystemExit("capture: libpcap is not installed (Debian: libpcap0.8; `make sysdeps`)") from None
    for i in range(prog.bf_len):
        ins = prog.bf_insns[i]
        if ins.code == BPF_RET_K and ins.k != 0:
            ins.k = snaplen
    return prog


def open_socket(dev: str, expr: str, snaplen: int):
    """scapy's listening socket on `dev`, its filter replaced by the headers-only program."""
    from scapy.arch.linux import L2ListenSocket
    from scapy.data import SO_ATTACH_FILTER
    from scapy.libs.structures import sock_fprog

    s = L2ListenSocket(iface=dev, filter=expr)
    prog = headers_only_filter(expr, snaplen)
    s.ins.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, sock_fprog(prog.bf_len, prog.bf_insns))
    s.ins.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
    return s


IPV4 = 0x0800
PORTS = struct.Struct("!HH")
DRAIN_IDLE_S = 0.3  # stopping: read what the socket still holds until it has been quiet this long
DRAIN_MAX_S = 10.0


def parse_headers(frame: bytes) -> tuple[str, str, int, int, int] | None:
    """(src, dst, IP total length, source port, destination port) of an Ethernet/IPv4 frame's first
    bytes; ports are 0 for protocols without them. None for anything else. Unpacked with struct:
    scapy's dissection costs about 0.9 ms per packet on this machine, more than the link's packet rate
    leaves, so scapy only captures (socket, BPF filter, kernel timestamps) and hands over raw bytes."""
    if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[14] >> 4 != 4:
        return None
    ihl = (frame[14] & 0x0F) * 4
    ip_len = (frame[16] << 8) | frame[17]
    proto = frame[23]
    src, dst = socket.inet_ntoa(frame[26:30]), socket.inet_ntoa(frame[30:34])
    sport = dport = 0
    if proto in (6, 17) and len(frame) >= 14 + ihl + 4:
        sport, dport = PORTS.unpack_from(frame, 14 + ihl)
    return src, dst, ip_len, sport, dport


def kernel_drops(s) -> int:
    """Packets the kernel dropped for this socket (its buffer was full): PACKET_STATISTICS."""
    from scapy.data import SOL_PACKET

    with contextlib.suppress(OSError):
        raw = s.ins.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
        return int.from_bytes(raw[4:8], sys.byteorder)
    return 0


def main(cfg_path: str) -> None:
    from scapy.packet import Raw
    from scapy.sendrecv import AsyncSniffer

    with open(cfg_path) as f:
        cfg = json.load(f)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    offset = time.time() - time.monotonic()  # packet stamps are CLOCK_REALTIME; the runs use monotonic
    bins = FlowBins()
    socks = {open_socket(dev, f"ip and dst net {c['net']}", cfg.get("snaplen", SNAPLEN)): dev
             for dev, c in cfg["ifaces"].items()}
    for s in socks:
        s.LL = Raw  # raw bytes to parse_headers, no dissection
    rates = {dev: float(c["rate_bps"]) for dev, c in cfg["ifaces"].items()}
    link = cfg["link"]
    last = [time.monotonic(), 0.0]  # when the last packet was handled, and its kernel timestamp

    def on_packet(p) -> None:
        h = parse_headers(p.load)
        last[0], last[1] = time.monotonic(), float(p.time)
        if h is None:
            return
        src, dst, ip_len, sport, dport = h
        dev = p.sniffed_on
        bins.add(FlowKey(link, dev, src, sport, dst, dport), float(p.time) - offset, ip_len + ETHERNET_HEADER,
                 rates[dev])

    sniffer = AsyncSniffer(opened_socket=socks, prn=on_packet, store=False, count=int(cfg["max_packets"]))
    sniffer.start()
    t_start, cpu_start = time.monotonic(), _cpu_s()
    print("ready", flush=True)
    deadline = t_start + float(cfg["seconds"])
    while not stop.wait(0.1):
        if time.monotonic() > deadline or not sniffer.running:
            break
    limited = "packets" if not sniffer.running else "time" if time.monotonic() > deadline else ""
    t_stop, drain_end = time.time(), time.monotonic() + DRAIN_MAX_S
    while sniffer.running and last[1] < t_stop and time.monotonic() < drain_end:  # what the socket still holds
        if time.monotonic() - last[0] > DRAIN_IDLE_S:
            break
        time.sleep(0.05)
    with contextlib.suppress(Exception):
        sniffer.stop()
    wall = time.monotonic() - t_start
    drops = sum(kernel_drops(s) for s in socks)
    for s in socks:
        s.close()
    out = {"link": link, "packets": bins.count, "kernel_drops": drops, "cpu_s": _cpu_s() - cpu_start,
           "wall_s": wall, "limited_by": limited,
           "bins": [[k.link, k.towards, k.src, k.sport, k.dst, k.dport, b, round(v, 1), n]
                    for k, b, v, n in bins.rows()]}
    tmp = cfg["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, cfg["out"])


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


@dataclass
class LinkCapture:
    link: str
    packets: int
    kernel_drops: int
    cpu_s: float
    wall_s: float
    limited_by: str


@dataclass
class CaptureResult:
    """Bytes per (flow, 1 ms bin on the monotonic clock) over every WAN link, and what it cost."""

    rows: list[tuple[FlowKey, int, float, int]] = field(default_factory=list)
    links: list[LinkCapture] = field(default_factory=list)

    def summary(self) -> str:
        pk = sum(c.packets for c in self.links)
        drops = sum(c.kernel_drops for c in self.links)
        cpu = sum(c.cpu_s for c in self.links)
        wall = max((c.wall_s for c in self.links), default=0.0)
        lim = sorted({c.limited_by for c in self.links if c.limited_by})
        return (f"captured {pk} packet headers on {len(self.links)} WAN link(s) in {wall:.1f} s; kernel drops {drops}; "
                f"capture CPU {cpu:.1f} s ({100 * cpu / wall if wall else 0:.0f} % of one core)"
                + (f"; stopped by its {' and '.join(lim)} limit" if lim else ""))


def host_flows(emu: Emulation, res: CaptureResult, ranks: dict[str, str] | None = None,
               run_id: str = "capture") -> list[tuple]:
    """flows.csv rows with each address mapped to its emulated host: its DC, its index in the DC (the
    replica of a launched job) and, when given, the ranks it runs (`ranks`: host IP -> "0|1")."""
    from testbed.analysis.flows import Endpoint, flow_rows

    by_ip = {h.ip: Endpoint(h.dc, str(h.index), (ranks or {}).get(h.ip, "")) for h in emu.addr.hosts}
    t0 = min((b for _, b, _, _ in res.rows), default=0)
    return flow_rows(run_id, res.rows, lambda ip, _port: by_ip.get(ip, Endpoint()), t0)


class Capture:
    """Capture processes on every WAN node of `emu`, started and stopped as a context manager."""

    def __init__(self, emu: Emulation, *, seconds: float = 60.0, max_packets: int = DEFAULT_MAX_PACKETS,
                 snaplen: int = SNAPLEN) -> None:
        self.emu, self.seconds, self.max_packets, self.snaplen = emu, seconds, max_packets, snaplen
        self.procs: list[tuple[subprocess.Popen, str, str]] = []  # (process, output file, WAN node)
        self.result: CaptureResult | None = None

    def start(self) -> Capture:
        from testbed.emu import state
        from testbed.emu.sh import EmuError

        emu, rdir = self.emu, state.run_dir(self.emu.prefix)
        for w in emu.addr.wans:
            rate = emu.link_bps(w.a, w.b)
            out = str(rdir / f"capture-{w.ns}.json")
            cfg = {"link": f"{w.a}-{w.b}", "seconds": self.seconds, "max_packets": self.max_packets,
                   "snaplen": self.snaplen, "out": out,
                   "ifaces": {dc: {"net": emu.addr.lan_subnet[dc], "rate_bps": rate} for dc in (w.a, w.b)}}
            path = rdir / f"capture-{w.ns}.cfg.json"
            path.write_text(json.dumps(cfg))
            log = open(rdir / f"capture-{w.ns}.log", "w")  # noqa: SIM115 (owned by the child)
            p = emu.backend.popen(emu.node(w.ns), [sys.executable, "-m", "testbed.emu.capture", str(path)],
                                  stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
            self.procs.append((p, out, w.ns))
        for p, _, ns in self.procs:
            r, _, _ = select.select([p.stdout], [], [], 30.0)
            line = p.stdout.readline().strip() if r else ""  # type: ignore[union-attr]
            if line != "ready":
                self.stop()
                err = (rdir / f"capture-{ns}.log").read_text().strip().splitlines()
                raise EmuError(f"the packet capture in {ns} did not start: {err[-1] if err else line or 'no output'}")
        return self

    def stop(self) -> CaptureResult:
        if self.result is not None:
            return self.result
        for p, _, _ in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        res = CaptureResult()
        for p, out, _ in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if not os.path.exists(out):
                continue
            with open(out) as f:
                d = json.load(f)
            res.links.append(LinkCapture(d["link"], d["packets"], d["kernel_drops"], d["cpu_s"], d["wall_s"],
                                         d["limited_by"]))
            res.rows += [(FlowKey(ln, tw, s, sp, dst, dp), b, v, n) for ln, tw, s, sp, dst, dp, b, v, n in d["bins"]]
        self.result = res
        return res

    def __enter__(self) -> Capture:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    main(sys.argv[1])

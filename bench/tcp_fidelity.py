"""Each network effect behind a gap between the simulator and the emulator, measured alone on a two-DC
emulated link (the numbers in docs/fidelity.md):

- window:   the window the kernel advertises for the emulator's receive buffer (2 W + 4 MSS, fixed), without
            and with the workers' TCP_WINDOW_CLAMP, read from the sender (ss: snd_wnd) during a bulk transfer;
- transfer: a message on one warmed, idle, window-bound connection (and striped over n connections by the
            workers' own transport) against the simulator's window rounds (costs/tcp.py windowed_send_s)
            and the fluid n W / RTT it replaced;
- delay:    the delay line's added latency: ping RTT minus twice the configured one-way latency, idle;
- restart:  the first message on a fresh connection, and one after an idle spell longer than the
            retransmission timeout with net.ipv4.tcp_slow_start_after_idle on and off;
- burst:    a message smaller than the window on an idle link (HTB's burst lets its first bytes through at
            the veth's speed): measured vs bytes / C + latency, on a path of 1,500-byte packets (20 Mbit/s) and
            of jumbo ones (200 Mbit/s), and a long message at 20 Mbit/s (the rate with a one-frame bucket);
- stripes:  a backlog of messages queued at once on a pipe of n connections over a link-bound link (a stage's
            sends behind a slow WAN): each message's arrival against the fluid one (the pipe as one flow at the
            link's rate, messages in order); a message waits for its slowest connection.

Needs root. Run: sudo .venv/bin/python bench/tcp_fidelity.py [--prefix gdtbN] [--only window,delay]
Timings on a shared machine are noisy: medians of several messages are printed with their range.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from testbed.costs.tcp import windowed_send_s
from testbed.emu.build import MSS, down, emulated_window, link_mss, receive_buffer, up
from testbed.emu.check import ping
from testbed.spec.topology import Topology

PROBE = str(Path(__file__).with_name("tcp_probe.py"))
ROOT = str(Path(__file__).resolve().parent.parent)


def topology(mbps: float, latency_ms: float, window_bytes: float) -> Topology:
    return Topology.model_validate({
        "name": "probe", "tcp_window_mb": window_bytes / 2**20,
        "dcs": [{"name": "east", "gpus": 8, "hosts": 1}, {"name": "west", "gpus": 8, "hosts": 1}],
        "links": [{"between": ["east", "west"], "gbps": mbps / 1e3, "latency_ms": latency_ms}]})


class Link:
    """An emulated east-west link and the probe processes on its two hosts."""

    def __init__(self, prefix: str | None, mbps: float, latency_ms: float, window_bytes: float,
                 slow_start_after_idle: bool = False) -> None:
        self.emu = up(topology(mbps, latency_ms, window_bytes), prefix=prefix, scale=1,
                      slow_start_after_idle=slow_start_after_idle)
        self.C, self.l = mbps * 1e6 / 8, latency_ms / 1e3
        self.ip = self.emu.addr.host("west-h0").ip

    def __enter__(self) -> Link:
        return self

    def __exit__(self, *exc: object) -> None:
        down(self.emu)

    def ns(self, host: str) -> str:
        return self.emu.addr.host(host).ns

    def spawn(self, host: str, *args: object) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.ns(host), sys.executable, PROBE, *map(str, args)],
                                stdout=subprocess.PIPE, text=True, cwd=ROOT)

    def ss(self, host: str, port: int) -> str:
        side = "dport" if host == "east-h0" else "sport"
        return subprocess.run(["ip", "netns", "exec", self.ns(host), "ss", "-tin", "state", "established", side,
                               f"= :{port}"], capture_output=True, text=True).stdout

    def server(self, *args: object) -> subprocess.Popen:
        p = self.spawn("west-h0", *args)
        if p.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            raise RuntimeError("the probe server did not start")
        return p

    def messages(self, window: int, nbytes: int, count: int, gap_s: float, port: int = 6001) -> list[float]:
        """Seconds from each message's first byte handed to the socket to its last byte read, one connection."""
        srv = self.server("server", port, window)
        cli = self.spawn("east-h0", "messages", self.ip, port, nbytes, count, gap_s)
        out = json.loads(cli.stdout.readline())  # type: ignore[union-attr]
        cli.wait()
        srv.wait()
        return [t1 - t0 for t0, t1 in out]

    def backlog(self, n: int, window: int, nbytes: int, count: int, rounds: int, gap_s: float,
                port: int = 6201) -> list[list[float]]:
        """[start, arrival] of `rounds` x `count` messages over n connections, each round's queued at once."""
        srv = self.server("pipe-server", port, n, count * rounds, window)
        cli = self.spawn("east-h0", "pipe-backlog", self.ip, port, n, nbytes, count, rounds, gap_s)
        out = json.loads(srv.stdout.readline())  # type: ignore[union-attr]
        cli.wait()
        srv.wait()
        return out

    def pipe(self, n: int, window: int, nbytes: int, count: int, gap_s: float, port: int = 6101) -> list[float]:
        """The same over n connections with the workers' own striped transport."""
        srv = self.server("pipe-server", port, n, count, window)
        cli = self.spawn("east-h0", "pipe-client", self.ip, port, n, nbytes, count, gap_s)
        out = json.loads(srv.stdout.readline())  # type: ignore[union-attr]
        cli.wait()
        srv.wait()
        return [t1 - t0 for t0, t1 in out]


def med(xs: list[float]) -> str:
    s = sorted(xs)
    return f"{s[len(s) // 2] * 1e3:8.1f} ms [{s[0] * 1e3:.1f}-{s[-1] * 1e3:.1f}]"


def window(prefix: str | None) -> None:
    print("\n-- the advertised window: 500 Mbit/s, 50 ms one way, bulk transfer on one connection")
    print(f"{'window W':>10}{'buffer B':>10}{'kernel: snd_wnd/B':>19}{'snd_wnd/W':>11}{'clamped: snd_wnd/W':>20}"
          f"{'goodput x RTT / W':>19}")
    for w_req in (65536, 131072, 524288, 2**21):
        w = emulated_window(w_req, 1)
        with Link(prefix, 500, 50, w) as link:
            row = []
            for port, clamp in ((6001, 0), (6002, w)):
                srv = link.server("sink", port, 1.0, clamp)
                cli = link.spawn("east-h0", "bulk", link.ip, port, 3.5)
                time.sleep(2.5)
                snd = re.findall(r"snd_wnd:(\d+)", link.ss("east-h0", port))
                cli.wait()
                res = json.loads(srv.stdout.readline())  # type: ignore[union-attr]
                srv.wait()
                row.append((int(snd[0]) if snd else 0, res["bytes"] / res["seconds"]))
        b = receive_buffer(w)
        (k_wnd, _), (c_wnd, c_rate) = row
        print(f"{w:>10}{b:>10}{k_wnd / b:>19.3f}{k_wnd / w:>11.3f}{c_wnd / w:>20.3f}{c_rate * 0.1 / w:>19.3f}")


def transfer(prefix: str | None) -> None:
    print("\n-- a window-bound message on a warmed idle connection: 200 Mbit/s, 20 ms one way, W = 16 MSS")
    print(f"{'connections':>12}{'bytes':>10}  {'measured (median [range])':<30}{'rounds model':>14}{'fluid':>10}")
    w = 16 * MSS
    with Link(prefix, 200, 20, w) as link:
        rtt = 2 * link.l
        for n, mult in ((1, 4.5), (1, 20.5), (8, 4.5), (70, 0.6), (70, 6.0)):
            a = int(mult * n * w)
            model = windowed_send_s(a, link.C, n * w, rtt) + link.l
            fluid = a / min(link.C, n * w / rtt) + link.l
            gap = max(0.3, 2 * fluid)
            d = link.messages(w, a, 8, gap)[2:] if n == 1 else link.pipe(n, w, a, 8, gap)[2:]
            print(f"{n:>12}{a:>10}  {med(d):<30}{model * 1e3:>11.1f} ms{fluid * 1e3:>7.1f} ms")


def delay(prefix: str | None) -> None:
    print("\n-- the delay line's added latency: ping RTT - 2 x one-way latency, idle link (200 Mbit/s)")
    print(f"{'one way':>8}{'min':>9}{'mean':>9}{'p99':>9}")
    for lat in (2, 20, 60):
        with Link(prefix, 200, lat, 2**20) as link:
            r = ping(link.emu, "east-h0", link.ip, 100)
            keys = ("rtt_min_ms", "rtt_avg_ms", "rtt_p99_ms")
            print(f"{lat:>6}ms" + "".join(f"{r[k] - 2 * lat:>7.2f}ms" for k in keys))


def restart(prefix: str | None) -> None:
    print("\n-- slow start: 200 Mbit/s, 20 ms one way, W = 64 MSS, messages of 4.5 W, 0.5 s apart (> RTO)")
    w = 64 * MSS
    a = int(4.5 * w)
    for on in (False, True):
        with Link(prefix, 200, 20, w, slow_start_after_idle=on) as link:
            d = link.messages(w, a, 8, 0.5)
            model = windowed_send_s(a, link.C, w, 2 * link.l) + link.l
            print(f"tcp_slow_start_after_idle={int(on)}: first {d[0] * 1e3:.1f} ms, later {med(d[2:])}; "
                  f"window rounds {model * 1e3:.1f} ms")


def burst(prefix: str | None) -> None:
    print("\n-- HTB's burst: a message smaller than the window on an idle link, vs bytes / C + latency")
    for mbps, nbytes in ((20, 65536), (20, 2**20), (200, 262144)):
        with Link(prefix, mbps, 5, 2**22) as link:
            d = link.messages(2**22, nbytes, 10, 0.3)[2:]
            print(f"{mbps} Mbit/s, {nbytes} bytes: {med(d)}; bytes / C + latency "
                  f"{(nbytes / link.C + link.l) * 1e3:.1f} ms")


def stripes(prefix: str | None) -> None:
    mss = link_mss(40e6)  # the path's segments at 40 Mbit/s (emu/build.py link_mss), not jumbo ones
    print(f"\n-- stripes: 5 messages queued at once on a pipe of n connections, 40 Mbit/s, 40 ms one way, W = 48 x"
          f" {mss} B each (n W above the bandwidth-delay product: link-bound); 6 rounds")
    print(f"{'connections':>12}{'bytes':>9}  {'late vs fluid: median':>22}{'p90':>9}{'max':>9}"
          f"{'  arrival k minus k-1 (fluid a/C)':>34}")
    w = 48 * mss
    count, rounds = 5, 6
    with Link(prefix, 40, 40, w) as link:
        for n, a in ((2, 256 * 1024), (8, 1024 * 1024)):
            out = link.backlog(n, w, a, count, rounds, count * a / link.C + 0.5)  # the link drains between rounds
            late, gaps = [], []
            for r in range(1, rounds):  # the first round warms the connections up
                msgs = out[r * count:(r + 1) * count]
                t0 = min(t for t, _ in msgs)
                late += [t1 - (t0 + (i + 1) * a / link.C + link.l) for i, (_, t1) in enumerate(msgs)]
                gaps += [b[1] - a_[1] for a_, b in zip(msgs, msgs[1:], strict=False)]
            late.sort()
            q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
            print(f"{n:>12}{a:>9}  {q(late, 0.5) * 1e3:>19.1f} ms{q(late, 0.9) * 1e3:>6.1f} ms{late[-1] * 1e3:>6.1f} ms"
                  f"  {med(gaps)} ({a / link.C * 1e3:.1f} ms)")


SECTIONS = {"window": window, "transfer": transfer, "delay": delay, "restart": restart, "burst": burst,
            "stripes": stripes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", default=None, help="emulation prefix gdtb<id> (default: the first free one)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    args = ap.parse_args()
    for name in args.only.split(","):
        SECTIONS[name](args.prefix)


if __name__ == "__main__":
    main()

"""What the scale k does to a foreign job's WAN transfers, per WAN link. Pure: unit-tested.

A WAN emulated at scale k carries C/k with windows of max(W/k, 64 KiB); its latency is the spec's. The
project's own workers divide their bytes by k, so their transfers take the real-world time. A foreign job
sends its real bytes, so each of its bulk transfers takes `dilation` times as long as on the spec's WAN
(up to k: less where the spec's link is window-bound, since only the link's rate, not the latency, is
divided). A job that divides its message sizes by k (a scale model) gets real-world times, except where the
window floor leaves an emulated connection `window_distortion` times faster than the scaled real-world one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from testbed.costs.tcp import striped_rate, windowed_send_s

DISTORTION_WARN = 2.0  # a link whose window floor distorts a connection's rate by more than this is named
SCALE_HEADER = ("link", "a", "b", "latency_ms", "scale", "spec_gbps", "emulated_mbps", "spec_window_bytes",
                "emulated_window_bytes", "connections", "dilation_1", "dilation_n", "window_distortion", "k_faithful")
FLOWS_SCALE_COLUMNS = ("scale", "dilation", "window_distortion")  # appended to a launch's flows.csv rows


@dataclass(frozen=True)
class LinkScale:
    """One WAN link (both directions alike) as the spec has it and as emulated at scale k."""

    a: str
    b: str
    latency_ms: float  # one way, the spec's and the emulated one
    scale: float
    spec_gbps: float
    emulated_mbps: float
    spec_window_bytes: float  # one connection's window in the spec
    emulated_window_bytes: float  # one emulated connection's (W / k, at least 64 KiB, whole segments)
    connections: int  # the launch's multi-TCP count (NCCL sockets); gloo uses 1
    dilation_1: float  # a bulk transfer of real bytes over 1 connection: emulated time / spec time
    dilation_n: float  # the same over `connections` connections
    window_distortion: float  # one emulated connection's rate / the scaled real-world one's (1: faithful)
    k_faithful: float  # the largest k whose scaled window needs no floor

    @property
    def link(self) -> str:
        return f"{self.a}-{self.b}"

    @property
    def rtt_s(self) -> float:
        return 2 * self.latency_ms / 1e3

    def row(self) -> dict:
        return {"link": self.link, **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}}


def link_scale(a: str, b: str, gbps: float, latency_ms: float, window_bytes: float, scale: float,
               emulated_window_bytes: float, connections: int, min_window_bytes: float) -> LinkScale:
    """The factors of one link at scale k (`emulated_window_bytes` from testbed.emu.build.emulated_window)."""
    rtt_s = 2 * latency_ms / 1e3
    cap, emu_cap = gbps * 1e9 / 8, gbps * 1e9 / 8 / scale

    def slower(n: int) -> float:
        return striped_rate(cap, n, window_bytes, rtt_s) / striped_rate(emu_cap, n, emulated_window_bytes, rtt_s)

    scaled_real = striped_rate(cap, 1, window_bytes, rtt_s) / scale
    return LinkScale(a, b, latency_ms, scale, gbps, gbps * 1e3 / scale, window_bytes, emulated_window_bytes,
                     connections, slower(1), slower(connections),
                     striped_rate(emu_cap, 1, emulated_window_bytes, rtt_s) / scaled_real,
                     window_bytes / min_window_bytes)


def transfer_dilation(ls: LinkScale, nbytes: float, connections: int = 1) -> float:
    """How many times longer a transfer of `nbytes` real bytes takes on the emulated link than on the spec's,
    latency included (the simulator's window model: testbed.costs.tcp.windowed_send_s)."""
    lat, rtt = ls.latency_ms / 1e3, ls.rtt_s
    spec = lat + windowed_send_s(nbytes, ls.spec_gbps * 1e9 / 8, connections * ls.spec_window_bytes, rtt)
    emu = lat + windowed_send_s(nbytes, ls.emulated_mbps * 1e6 / 8, connections * ls.emulated_window_bytes, rtt)
    return emu / spec


def _kib(x: float) -> str:
    return f"{x / 2**20:g} MiB" if x >= 2**20 else f"{x / 1024:.0f} KiB"


def describe(ls: LinkScale) -> str:
    """One line per link: spec against emulated rate and window, and the dilation of a job's real bytes."""
    n = ls.connections
    dil = (f"{ls.dilation_1:,.1f}x" if n == 1 or abs(ls.dilation_n - ls.dilation_1) < 0.05
           else f"{ls.dilation_1:,.1f}x (gloo, 1 connection), {ls.dilation_n:,.1f}x ({n} NCCL sockets)")
    return (f"{ls.link}: {ls.spec_gbps:g} Gbit/s, window {_kib(ls.spec_window_bytes)} -> emulated "
            f"{ls.emulated_mbps:,.4g} Mbit/s, window {_kib(ls.emulated_window_bytes)} "
            f"({ls.window_distortion:,.2f}x the scaled one); "
            f"a transfer of real bytes takes {dil} as long (latency {ls.latency_ms:g} ms unchanged)")


def floor_warnings(links: list[LinkScale], machine_k: float | None = None) -> list[str]:
    """One line per link whose window floor distorts a scale model by more than DISTORTION_WARN. `machine_k`: the
    smallest k the machine carries (--scale auto), when known: a k that avoids the floor below it is out of reach."""
    out = []
    for ls in links:
        if ls.window_distortion <= DISTORTION_WARN:
            continue
        fix = f"k <= {ls.k_faithful:,.4g} avoids it"
        if machine_k is not None and ls.k_faithful < machine_k:
            fix += (f", but this machine carries this WAN at k >= {machine_k:,.6g} only: emulate slower links "
                    f"(--set) or read the WAN times of a scale model as lower bounds")
        out.append(f"{ls.link}: at k={ls.scale:,.6g} the {_kib(ls.emulated_window_bytes)} window floor makes one "
                   f"emulated connection {ls.window_distortion:,.1f}x faster than the scaled real-world one (a scale "
                   f"model's transfers come out too fast); {fix}")
    return out


def links_table(links: list[LinkScale], scale: float, lans: dict[str, dict] | None = None) -> dict:
    """The TESTBED_LINKS file's content: k, each WAN link's factors in both directions, and each DC's host link
    (`lans`: DC -> {"spec_gbps", "emulated_mbps"}; emulated_mbps None where it is left unshaped)."""
    rows = []
    for ls in links:
        rows += [{**ls.row(), "src_dc": ls.a, "dst_dc": ls.b}, {**ls.row(), "src_dc": ls.b, "dst_dc": ls.a}]
    return {"scale": scale, "links": rows, "lans": lans or {}}


def emulation_lans(emu) -> dict[str, dict]:
    """Each DC's host link into its fabric, as the spec has it and as emulated."""
    out = {}
    for d in emu.topo.dcs:
        rate = emu.lan_rate_bps(d.name)
        out[d.name] = {"spec_gbps": d.intra_gbps * emu.lan_gpus_per_host,
                       "emulated_mbps": None if rate is None else round(rate / 1e6, 4)}
    return out


def emulation_scales(emu, connections: int) -> list[LinkScale]:
    """Every WAN link of a built emulation (testbed.emu.build.Emulation) at its scale."""
    from testbed.emu.build import MIN_WINDOW

    out = []
    for link in emu.topo.links:
        a, b = link.between
        out.append(link_scale(a, b, link.gbps, link.latency_ms, emu.topo.window_mb(link) * 2**20, emu.scale,
                              emu.window_bytes(a, b), connections, MIN_WINDOW))
    return out

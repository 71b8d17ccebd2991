"""The simulator's network model of single WAN transfers, in real-world units, from a TESTBED_LINKS table:
what a job's own script compares its scale model's measured times with. Standard library and the sim's
network model only (testbed.launch.check.replay)."""

from __future__ import annotations

from testbed.launch.check import Transfer, replay


def transfer_s(link: dict, nbytes: float, connections: int = 1, *, emulated: bool = False) -> float:
    """Seconds from a transfer's first byte leaving to its last arriving, alone on one direction of `link` (a row
    of links.json): the spec's WAN, or with `emulated` the emulated one."""
    cap = (link["emulated_mbps"] * 1e6 if emulated else link["spec_gbps"] * 1e9) / 8
    win = link["emulated_window_bytes"] if emulated else link["spec_window_bytes"]
    x = Transfer(link["link"], link["dst_dc"], "", "", 0.0, 0.0, nbytes, connections)
    replay([x], cap, win, 2 * link["latency_ms"] / 1e3)
    return link["latency_ms"] / 1e3 + x.model_s


def exchange_s(links: list[dict], dcs: list[str], nbytes: float, connections: int = 1) -> float:
    """All DCs send `nbytes` to every other DC at once, each direction on its own link: the time until the last
    arrives (the cross-DC step of a hierarchical all-reduce by direct exchange)."""
    rows = [r for r in links if r["src_dc"] in dcs and r["dst_dc"] in dcs]
    return max((transfer_s(r, nbytes, connections) for r in rows), default=0.0)

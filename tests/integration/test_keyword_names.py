"""DC names that are `ip` and `tc` keywords (or their abbreviations) build a working WAN: every ip/tc
call names its device with `dev` (or `name`), so `ip` never reads a DC called `a` as `address`."""

from __future__ import annotations

from testbed.emu.build import down, up
from testbed.spec.load import validate
from testbed.spec.topology import Topology
from tests.integration.conftest import snapshot_of

# ip link keywords and abbreviations (a = address, up, down, mtu, name, peer, type, netns, master, help,
# dev, link, addr), all valid DC names by the spec's own rule
NAMES = ["a", "dev", "up", "link", "addr", "mtu", "name", "peer", "help", "down", "type", "netns", "master"]


def test_keyword_dc_names_build_route_and_tear_down():
    topo = validate(Topology, {
        "name": "keywords",
        "dcs": [{"name": n, "gpus": 8, "hosts": 1} for n in NAMES],
        # a chain: the WAN node of each link holds two interfaces named after its DCs, shaped and delayed
        "links": [{"between": [x, y], "gbps": 0.1, "latency_ms": 1} for x, y in zip(NAMES, NAMES[1:], strict=False)],
    }, "topology")
    before = snapshot_of("gdtbh1")
    emu = up(topo, prefix="gdtbh1", scale=1)
    try:
        during = snapshot_of("gdtbh1")
        assert len(during["netns"] - before["netns"]) == 2 * len(NAMES) + len(NAMES) - 1
        for x, y in zip(NAMES, NAMES[1:], strict=False):
            src, dst = emu.addr.host(f"{x}-h0"), emu.addr.host(f"{y}-h0")
            out = emu.backend.run(emu.node(src.ns), ["ping", "-n", "-c", "2", "-i", "0.2", "-W", "3", dst.ip],
                                  check=False)
            assert " 0% packet loss" in out, f"{x} -> {y}: {out}"
            wan = emu.node(emu.addr.wan(x, y).ns)
            qdiscs = emu.backend.run(wan, ["tc", "qdisc", "show", "dev", y])
            assert "htb" in qdiscs, qdiscs  # the shaping went onto the interface named after the DC
    finally:
        down(emu)
    assert snapshot_of("gdtbh1") == before

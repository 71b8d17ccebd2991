"""Containernet backend: each emulated host is a Docker container (`network_mode='none'`), gateways
and WAN nodes are Mininet hosts, DC LANs are LinuxBridge switches; shaping and delay are ours.

Needs Containernet installed from its upstream source (it installs itself as the `mininet`
package, so keep it in its own venv) and a running Docker engine; see the README. With dockerd's
default `iptables -P FORWARD DROP` and br_netfilter, root-namespace bridges drop everything until
bridged traffic is accepted: `iptables -I DOCKER-USER -m physdev --physdev-is-bridged -j ACCEPT`.
"""

from __future__ import annotations

import os

from testbed.emu.backends.base import Node
from testbed.emu.backends.mininet import MininetBackend
from testbed.emu.sh import EmuError

IMAGE = os.environ.get("GDTB_HOST_IMAGE", "gdtb/worker:latest")


def containernet_available() -> str | None:
    """None when usable, else the reason it is not."""
    try:
        from mininet.net import Containernet  # noqa: F401
    except ImportError:
        return "Containernet is not installed (it is not on PyPI; install it from its upstream source)"
    try:
        import docker

        docker.from_env().ping()
    except Exception as e:  # noqa: BLE001 - any failure means no usable engine
        return f"no Docker engine reachable ({type(e).__name__})"
    return None


class ContainernetBackend(MininetBackend):
    name = "containernet"

    def __init__(self, prefix: str) -> None:
        reason = containernet_available()
        if reason:
            raise EmuError(f"the containernet backend is unavailable: {reason}")
        super().__init__(prefix)

    def _make_net(self, Mininet):
        from mininet.net import Containernet

        return Containernet(controller=None, switch=self.LinuxBridge, build=False)

    def add_node(self, name: str, role: str) -> Node:
        if role != "host":
            return super().add_node(name, role)
        d = self.net.addDocker(name, ip=None, dimage=IMAGE, network_mode="none", labels={"gdtb": self.prefix})
        node = Node(name, role, pid=d.pid, extra={"container": True})
        self.nodes[name], self.mn[name] = node, d
        return node

    def argv(self, node: Node, argv: list[str]) -> list[str]:
        if node.extra.get("container"):
            # the host's tools in the container's network namespace; the image needs none of them
            return ["nsenter", "-t", str(node.pid), "-n", *argv]
        return super().argv(node, argv)

"""Containernet backend: every emulated node is a Containernet Docker host (`network_mode='none'`)
running its role image, as on the docker backend; Containernet creates the containers and the veths,
and each DC LAN is a LinuxBridge switch in the root namespace. Shaping and delay are ours.

Needs Containernet installed from its upstream source (it installs itself as the `mininet` package,
so keep it in its own venv; README) and a running Docker engine. Two things about Containernet
(c0689423) shape this adapter:
- it creates every veth in the root namespace before moving it, so an interface name must be free
  there (`eth0` never is): links get unique names, renamed inside the node afterwards;
- it labels its containers `com.containernet` (ours are ignored) and names them `mn.<node>`, so
  `testbed clean` also removes containers named `mn.<prefix>-...`.
With dockerd's default `iptables -P FORWARD DROP` and br_netfilter, root-namespace bridges drop
everything; the backend refuses to start then and prints the rule that fixes it.
"""

from __future__ import annotations

import subprocess

from testbed.emu import containers, state
from testbed.emu.backends.base import Node
from testbed.emu.backends.mininet import MininetBackend
from testbed.emu.sh import EmuError, run


def containernet_available() -> str | None:
    """None when usable, else the reason it is not."""
    try:
        from mininet.net import Containernet  # noqa: F401
    except ImportError:
        return "Containernet is not installed (it is not on PyPI; install it from its upstream source, see the README)"
    return containers.unavailable()


def bridged_traffic_dropped() -> bool:
    """dockerd's FORWARD DROP policy applies to bridged frames when br_netfilter is on."""
    try:
        with open("/proc/sys/net/bridge/bridge-nf-call-iptables") as f:
            if f.read().strip() != "1":
                return False
    except OSError:
        return False
    rules = run(["iptables", "-S", "FORWARD"], check=False)
    accept = run(["iptables", "-S", "DOCKER-USER"], check=False)
    return "-P FORWARD DROP" in rules and "--physdev-is-bridged -j ACCEPT" not in accept


class ContainernetBackend(MininetBackend):
    name = "containernet"
    service_uid = containers.IMAGE_UID

    def __init__(self, prefix: str) -> None:
        reason = containernet_available()
        if reason:
            raise EmuError(f"the containernet backend is unavailable: {reason}")
        if bridged_traffic_dropped():
            raise EmuError("dockerd's FORWARD DROP policy would drop every frame on the DC bridges; accept bridged "
                           "traffic first: iptables -I DOCKER-USER -m physdev --physdev-is-bridged -j ACCEPT")
        super().__init__(prefix)
        self.n_links = 0
        self.gpus = containers.gpu_ids()

    def _make_net(self, Mininet):
        from mininet.log import setLogLevel
        from mininet.net import Containernet

        # Containernet sets interfaces up through each container's shell, which in the worker image runs
        # as the unprivileged user and logs "Operation not permitted"; we set them up ourselves (nsenter)
        setLogLevel("critical")

        return Containernet(controller=None, switch=self.LinuxBridge, build=False)

    def add_node(self, name: str, role: str) -> Node:
        rdir = str(state.run_dir(self.prefix))
        caps = ["net_admin"]  # Containernet adds it to every container anyway; it needs it for its own set-up
        gpus = containers.gpu_request(self.gpus, self.host_count()) if role == "host" else []
        mounts = [f"{m}:{m}:rw" for m in self.mounts] if role == "host" else []  # a launched job's files
        d = self.net.addDocker(name, ip=None, dimage=containers.image(role), network_mode="none",
                               volumes=[f"{rdir}:{rdir}:rw", *mounts], cap_add=caps, device_requests=gpus)
        node = Node(name, role, pid=d.pid, extra={"container": f"mn.{name}"})
        self.nodes[name], self.mn[name] = node, d
        return node

    def _temp_names(self) -> tuple[str, str]:
        self.n_links += 1
        return f"{self.prefix}t{self.n_links}a", f"{self.prefix}t{self.n_links}b"

    def _rename(self, node: Node, tmp: str, final: str, mtu: int) -> None:
        self.run(node, ["ip", "link", "set", "dev", tmp, "down"])
        self.run(node, ["ip", "link", "set", "dev", tmp, "name", final])
        self.run(node, ["ip", "link", "set", "dev", final, "mtu", str(mtu), "up"])

    def link(self, a: Node, a_if: str, b: Node, b_if: str, mtu: int) -> None:
        ta, tb = self._temp_names()
        self.net.addLink(self.mn[a.name], self.mn[b.name], intfName1=ta, intfName2=tb)
        self._rename(a, ta, a_if, mtu)
        self._rename(b, tb, b_if, mtu)

    def attach_lan(self, index: int, gw: Node, hosts: list[Node], mtu: int) -> str:
        sw = self.net.addSwitch(f"{self.prefix}s{index}", cls=self.LinuxBridge)
        for port, n in enumerate([*hosts, gw], start=1):
            tmp, _ = self._temp_names()
            self.net.addLink(self.mn[n.name], sw, intfName1=tmp, intfName2=f"{sw.name}-eth{port}")
            self._rename(n, tmp, "eth0" if n is not gw else "lan0", mtu)
        return "lan0"

    def argv(self, node: Node, argv: list[str]) -> list[str]:
        # the host's tools in the container's network namespace; the images need none of them
        return ["nsenter", "-t", str(node.pid), "-n", *argv]

    def spawn(self, node: Node | None, module: str, args: list[str], **kw) -> subprocess.Popen:
        return containers.spawn(self.prefix, node, module, args, **kw)

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            containers.remove_containers(self.prefix)

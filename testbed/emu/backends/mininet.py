"""Mininet backend: Mininet hosts (unnamed namespaces held by a shell), LinuxBridge switches for the
DC LANs, no controller, no Open vSwitch. WAN shaping and delay are ours, as on every backend:
Mininet's TCLink `delay=` silently does nothing without netem (this kernel has none: testbed/emu/kernel.py).

Never calls `mininet.clean.cleanup()` / `mn -c`: they kill by program name and delete /tmp/*.log.
The network lives only inside the process that built it (the hosts are that process's shells).
"""

from __future__ import annotations

from testbed.emu.backends.base import Backend, Node
from testbed.emu.sh import EmuError


def _mininet():
    try:
        from mininet.log import setLogLevel
        from mininet.net import Mininet
        from mininet.node import Host
        from mininet.nodelib import LinuxBridge
    except ImportError:
        raise EmuError("the mininet backend needs Mininet: `pip install '.[mininet]'` (and Debian's mininet "
                       "package for mnexec; `make sysdeps`)") from None
    setLogLevel("error")
    return Mininet, Host, LinuxBridge


class MininetBackend(Backend):
    name = "mininet"
    persistent = False
    net_class_name = "Mininet"

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix)
        Mininet, self.Host, self.LinuxBridge = _mininet()
        self.net = self._make_net(Mininet)
        self.mn: dict[str, object] = {}

    def _make_net(self, Mininet):
        return Mininet(topo=None, switch=self.LinuxBridge, controller=None, build=False, autoSetMacs=False,
                       autoStaticArp=False)

    def add_node(self, name: str, role: str) -> Node:
        h = self.net.addHost(name, cls=self.Host, ip=None)  # ip=None: Mininet assigns no 10.0.0.0/8 address
        node = Node(name, role, pid=h.pid)
        self.nodes[name], self.mn[name] = node, h
        return node

    def link(self, a: Node, a_if: str, b: Node, b_if: str, mtu: int) -> None:
        self.net.addLink(self.mn[a.name], self.mn[b.name], intfName1=a_if, intfName2=b_if)
        for n, i in ((a, a_if), (b, b_if)):
            self.run(n, ["ip", "link", "set", "dev", i, "mtu", str(mtu), "up"])

    def attach_lan(self, index: int, gw: Node, hosts: list[Node], mtu: int) -> str:
        sw = self.net.addSwitch(f"{self.prefix}s{index}", cls=self.LinuxBridge)  # a root-namespace bridge
        for port, n in enumerate([*hosts, gw], start=1):
            ifname = "eth0" if n is not gw else "lan0"
            self.net.addLink(self.mn[n.name], sw, intfName1=ifname, intfName2=f"{sw.name}-eth{port}")
            self.run(n, ["ip", "link", "set", "dev", ifname, "mtu", str(mtu), "up"])
        return "lan0"

    def start(self) -> None:
        self.net.start()
        for sw in self.net.switches:  # bridge ports carry jumbo frames too
            for intf in sw.intfList():
                if intf.name != "lo":
                    from testbed.emu.sh import run

                    run(["ip", "link", "set", "dev", intf.name, "mtu", "9000"])

    def argv(self, node: Node, argv: list[str]) -> list[str]:
        return ["mnexec", "-a", str(node.pid), *argv]

    def teardown(self) -> None:
        self.net.stop()
        self.nodes.clear()

"""The backend interface and the node type every backend returns."""

from __future__ import annotations

import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass
class Node:
    name: str  # e.g. gdtb0-useast-h0
    role: str  # host | gateway | wan
    ns: str | None = None  # a named netns (netns backend), else None
    pid: int | None = None  # a process in the node's namespaces (mininet, containernet)
    extra: dict = field(default_factory=dict)


class NoRelay:
    def close(self) -> None:
        """Nothing to stop."""


class Backend(ABC):
    name: str
    persistent: bool  # does the network outlive the process that built it?
    service_uid: int | None = None  # the user role processes run as, where it is not root (container images)

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.nodes: dict[str, Node] = {}
        self.mounts: list[str] = []  # host folders a container backend mounts in host containers (testbed launch)

    @abstractmethod
    def add_node(self, name: str, role: str) -> Node: ...

    @abstractmethod
    def link(self, a: Node, a_if: str, b: Node, b_if: str, mtu: int) -> None:
        """A veth pair between two nodes, both ends up, with the given MTU."""

    @abstractmethod
    def attach_lan(self, index: int, gw: Node, hosts: list[Node], mtu: int) -> str:
        """Join a DC's hosts (each on its `eth0`) and its gateway on one L2 segment; return the gateway's
        interface on it."""

    @abstractmethod
    def argv(self, node: Node, argv: list[str]) -> list[str]:
        """The host command that runs `argv` inside `node`'s network namespace."""

    @abstractmethod
    def teardown(self) -> None: ...

    def host_count(self) -> int:
        """Hosts added so far: container backends give the n-th host the n-th GPU."""
        return sum(1 for n in self.nodes.values() if n.role == "host")

    def start(self) -> None:  # noqa: B027 - optional hook, a no-op for most backends
        """Called once every node and link exists (Mininet starts its switches here)."""

    def control_relay(self, controller) -> NoRelay:
        """What carries other machines' workers to `controller` (a cluster: testbed/cluster/driver.py); here
        nothing: every worker is on this machine."""
        return NoRelay()

    def start_sidecar(self, node: Node, cfg: dict) -> list | None:
        """Start a WAN link's Atlas sidecar elsewhere (a cluster's machines) and return its processes; None: the
        caller starts it here (testbed/emu/train.py)."""
        return None

    def clock_offset_s(self, node: Node) -> float:
        """How far the CLOCK_MONOTONIC of the machine holding `node` is ahead of this process's (a cluster's
        separate servers: testbed/cluster/clock.py); 0 here: one kernel, one clock."""
        return 0.0

    def delay_stats(self) -> dict[str, dict] | None:
        """The delay lines' stats where they run elsewhere (a cluster's machines); None: here, read them."""
        return None

    def run(self, node: Node, argv: list[str], **kw) -> str:
        from testbed.emu.sh import run

        return run(self.argv(node, argv), **kw)

    def popen(self, node: Node, argv: list[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.argv(node, argv), **kw)

    def spawn(self, node: Node | None, module: str, args: list[str], **kw) -> subprocess.Popen:
        """Run one of the testbed's role processes (`python -m module args`) inside `node`, or beside the
        network when `node` is None (the BubbleTea service). Here: this interpreter in the node's network
        namespace; container backends run it in the node's role image instead."""
        argv = [sys.executable, "-m", module, *args]
        return self.popen(node, argv, **kw) if node is not None else subprocess.Popen(argv, **kw)

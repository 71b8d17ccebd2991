"""Backends build nodes (isolated network stacks) and veth links; the builder configures them.

One interface: add_node, link, argv (how to run a command inside a node), popen, teardown.
"""

from __future__ import annotations

from testbed.emu.backends.base import Backend, Node
from testbed.emu.sh import EmuError

BACKENDS = ("netns", "docker", "mininet", "containernet")


def make_backend(name: str, prefix: str) -> Backend:
    if name == "netns":
        from testbed.emu.backends.netns import NetnsBackend

        return NetnsBackend(prefix)
    if name == "docker":
        from testbed.emu.backends.docker import DockerBackend

        return DockerBackend(prefix)
    if name == "mininet":
        from testbed.emu.backends.mininet import MininetBackend

        return MininetBackend(prefix)
    if name == "containernet":
        from testbed.emu.backends.containernet import ContainernetBackend

        return ContainernetBackend(prefix)
    raise EmuError(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Backend", "Node", "make_backend"]

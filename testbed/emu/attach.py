"""Re-attach to a topology a previous `testbed topology up` left running (netns and docker backends)."""

from __future__ import annotations

from testbed.emu import state
from testbed.emu.backends.base import Node
from testbed.emu.backends.netns import NetnsBackend
from testbed.emu.build import Emulation
from testbed.emu.names import address_plan
from testbed.emu.sh import EmuError
from testbed.spec.topology import Topology


def attach(prefix: str) -> Emulation:
    st = state.load(prefix)
    if st is None:
        raise EmuError(f"no topology with prefix {prefix} is up; start one with `testbed topology up TOPOLOGY.yaml`")
    if st["backend"] not in ("netns", "docker"):
        raise EmuError(f"topology {prefix} uses the {st['backend']} backend, which lives only inside the process "
                       f"that built it")
    topo = Topology.model_validate(st["topology"])
    if st["backend"] == "docker":
        from testbed.emu.backends.docker import DockerBackend

        be: NetnsBackend = DockerBackend(prefix, check_images=False)
    else:
        be = NetnsBackend(prefix)
    roles = {}
    addr = address_plan(topo, prefix)
    roles.update({h.ns: "host" for h in addr.hosts})
    roles.update({ns: "gateway" for ns, _ in addr.gateways.values()})
    roles.update({w.ns: "wan" for w in addr.wans})
    for ns in st["namespaces"]:  # a docker node's container has its namespace's name
        be.nodes[ns] = Node(ns, roles.get(ns, "?"), ns=ns, extra={"container": ns} if be.name == "docker" else {})
    return Emulation(prefix, topo, be, addr, st["scale"], st["delay"], st.get("notes", []),
                     realtime=st.get("realtime", "off"))

"""Docker backend: every emulated node is a Docker container with no network of its own
(`network_mode='none'`). Our veths are moved into it, and each WAN link is shaped and delayed exactly
as on the netns backend, so the same experiment gives comparable results.

Hosts run the worker image (user `gdtb`, no capabilities, one GPU each with `--gpus device=N` when
the machine has GPUs); gateways and WAN nodes run the atlas image (root with only NET_ADMIN), where
the delay line and the Atlas sidecar run. Each container's network namespace is also named under
/run/netns (`ip netns attach`), so the builder's ip, tc and iptables, and netlink, reach it by name;
the containers themselves need none of those tools. The run directory (/run/gdtb/<prefix>) is
bind-mounted at the same path, so configs and control sockets have one path everywhere.
"""

from __future__ import annotations

import subprocess

from testbed.emu import containers, state
from testbed.emu.backends.base import Node
from testbed.emu.backends.netns import NetnsBackend
from testbed.emu.sh import run


class DockerBackend(NetnsBackend):
    name = "docker"
    persistent = True
    service_uid = containers.IMAGE_UID

    def __init__(self, prefix: str, *, check_images: bool = True) -> None:
        super().__init__(prefix)
        self.client = containers.client()
        if check_images:
            containers.require_images(self.client)
        self.gpus = containers.gpu_ids()

    def _container_kw(self, name: str, role: str) -> dict:
        rdir = str(state.run_dir(self.prefix))
        kw = {
            "image": containers.image(role), "name": name, "hostname": name.split("-", 1)[1][:63],
            "command": ["sleep", "infinity"], "detach": True, "init": True, "network_mode": "none",
            "labels": {containers.LABEL: self.prefix, "gdtb.role": role},
            "volumes": {rdir: {"bind": rdir, "mode": "rw"}}, "cap_drop": ["ALL"],
        }
        if role in ("gateway", "wan"):
            kw["cap_add"] = ["NET_ADMIN"]  # the delay line's NFQUEUE socket and the sidecar's tc changes
        else:
            kw["volumes"].update({m: {"bind": m, "mode": "rw"} for m in self.mounts})  # a launched job's files
            if self.gpus:
                kw["device_requests"] = containers.gpu_request(self.gpus, self.host_count())
        return kw

    def add_node(self, name: str, role: str) -> Node:
        c = self.client.containers.run(**self._container_kw(name, role))
        self.nodes[name] = node = Node(name, role, ns=name, extra={"container": name})
        c.reload()
        node.pid = int(c.attrs["State"]["Pid"])
        containers.attach_netns(name, node.pid)
        run(["ip", "-n", name, "link", "set", "dev", "lo", "up"])
        return node

    def spawn(self, node: Node | None, module: str, args: list[str], **kw) -> subprocess.Popen:
        return containers.spawn(self.prefix, node, module, args, **kw)

    def teardown(self) -> None:
        for name in list(self.nodes):
            run(["ip", "netns", "del", name], check=False)
        containers.remove_containers(self.prefix)
        self.nodes.clear()

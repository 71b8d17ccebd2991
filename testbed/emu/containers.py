"""What every container backend shares: the Docker engine, the role images, the labels that let
`clean` find our containers, and role processes run inside a container with a real process handle.

Role processes start with `docker exec`, so they run in the container's image, user, capabilities
and cgroup. Killing a `docker exec` client does not kill what it started, so each process carries a
tag in its environment and `ContainerProcess` signals the process itself (found by that tag in
/proc, visible from the host), not only the client.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from pathlib import Path

from testbed.emu import state
from testbed.emu.names import OURS_RE
from testbed.emu.sh import EmuError, run

LABEL = "gdtb.prefix"  # every container the testbed creates carries it; `testbed clean` removes by it
IMAGE_REPO = os.environ.get("GDTB_IMAGE_REPO", "gdtb")
ROLE_IMAGES = {"host": "worker", "gateway": "atlas", "wan": "atlas", "bubbletea": "bubbletea"}
IMAGE_UID = 1000  # the unprivileged user `gdtb` of the worker and bubbletea images
IMAGE_GID = 1000  # its primary group, `gdtb`: the group of a container run's control sockets
PYTHON = "/opt/gdtb/bin/python"  # the testbed's venv inside every role image
TAG_ENV = "GDTB_PROC"


def image(role: str) -> str:
    return f"{IMAGE_REPO}/{ROLE_IMAGES[role]}:latest"


def client():
    """The Docker SDK's client for the local engine, or a one-line error that says what to do."""
    try:
        import docker
    except ImportError:
        raise EmuError("container backends need the Docker SDK: `pip install '.[docker]'` (make venv does)") from None
    try:
        c = docker.from_env(timeout=60)
        c.ping()
    except Exception as e:  # noqa: BLE001 - any failure here means there is no usable engine
        raise EmuError(f"no Docker engine reachable ({type(e).__name__}); start one (`scripts/dockerd.sh start` "
                       f"where there is no systemd) and retry") from None
    return c


def missing_images(c, roles: tuple[str, ...] = ("host", "wan", "bubbletea")) -> list[str]:
    import docker

    out = []
    for name in sorted({image(r) for r in roles}):
        try:
            c.images.get(name)
        except docker.errors.ImageNotFound:
            out.append(name)
    return out


def require_images(c) -> None:
    missing = missing_images(c)
    if missing:
        raise EmuError(f"image {missing[0]} not found; build the role images with `make images` (on a machine "
                       f"with no registry: `make base-image images`)")


def unavailable() -> str | None:
    """None when the docker backend can run here, else why not (for skips and `testbed` checks)."""
    try:
        missing = missing_images(client())
    except EmuError as e:
        return str(e)
    return f"image {missing[0]} not built (`make base-image images`)" if missing else None


def gpu_ids() -> list[str]:
    """GPUs the host has (nvidia-smi's indices); [] where there are none, as on CPU machines."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return []
    return [ln.strip() for ln in out.stdout.splitlines() if ln.strip().isdigit()] if out.returncode == 0 else []


def gpu_request(gpus: list[str], n: int) -> list:
    """`--gpus device=N` for the n-th host container: one GPU each, round-robin; [] without GPUs."""
    if not gpus:
        return []
    import docker

    return [docker.types.DeviceRequest(device_ids=[gpus[n % len(gpus)]], capabilities=[["gpu"]])]


def tagged_pids(tag: str) -> list[int]:
    """Host PIDs of the processes whose environment carries GDTB_PROC=tag."""
    needle = f"{TAG_ENV}={tag}".encode() + b"\0"
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (d / "environ").read_bytes() + b"\0":
                    pids.append(int(d.name))
    return pids


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


class ContainerProcess(subprocess.Popen):
    """A `docker exec` (or `docker run`) client whose signals reach the process in the container."""

    def __init__(self, docker_argv: list[str], *, ns_pid: int | None = None, **kw) -> None:
        self.tag = uuid.uuid4().hex[:16]
        self.ns_pid = ns_pid  # a process in the container (its init), whose PID namespace the process joins
        # ["docker", "exec"|"run", -e TAG, the rest]: the tag goes to the process, not to the client
        super().__init__([*docker_argv[:2], "-e", f"{TAG_ENV}={self.tag}", *docker_argv[2:]], **kw)

    def inner_pids(self) -> list[int]:
        """Host PIDs of the process this client started (see `owns`)."""
        return [p for p in tagged_pids(self.tag) if self._in_container(p)]

    def owns(self, pid: int) -> bool:
        """Whether host PID `pid` is the process this client started: it carries the tag and, where the
        container is known, lives in the container's PID namespace (the tag is on the client's command
        line, so anyone could copy it into a process of their own; no one else can enter the container)."""
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False
        return f"{TAG_ENV}={self.tag}".encode() in env.split(b"\0") and self._in_container(pid)

    def _in_container(self, pid: int) -> bool:
        if self.ns_pid is None:
            return True
        want = _pid_ns(self.ns_pid)
        return want is not None and _pid_ns(pid) == want

    def send_signal(self, sig: int) -> None:
        inner = self.inner_pids()
        for pid in inner:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if not inner or sig == signal.SIGKILL:
            super().send_signal(sig)


def spawn(prefix: str, node, module: str, args: list[str], **kw) -> ContainerProcess:
    """A role process (`python -m module args`) in its image: inside the node's container, as the image's
    user; or, for the service beside the network (node None, the BubbleTea service), in a container of its
    own with no network and only the run directory."""
    argv = [PYTHON, "-m", module, *args]
    if node is not None:
        return ContainerProcess(["docker", "exec", node.extra["container"], *argv], ns_pid=node.pid, **kw)
    rdir = str(state.run_dir(prefix))
    return ContainerProcess(
        ["docker", "run", "--rm", "-i", "--init", "--network", "none", "--cap-drop", "ALL",
         "--name", f"{prefix}-{module.rsplit('.', 1)[-1].replace('_', '-')}", "--label", f"{LABEL}={prefix}",
         "-v", f"{rdir}:{rdir}", image("bubbletea"), *argv], **kw)


def _is_ours(ct, prefix: str | None) -> bool:
    """Labelled by us, or named `mn.<prefix>-...` by Containernet (which replaces the labels it is given)."""
    label = ct.labels.get(LABEL)
    if label is not None:
        return prefix is None or label == prefix
    if not ct.name.startswith("mn."):
        return False
    name = ct.name.removeprefix("mn.")
    return bool(OURS_RE.match(name)) and (prefix is None or name.startswith(f"{prefix}-"))


def _prefix_of(ct) -> str:
    return ct.labels.get(LABEL) or ct.name.removeprefix("mn.").split("-", 1)[0]


def remove_containers(prefix: str | None, keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Force-remove every container of our prefix (or of any testbed prefix but those in `keep`); best
    effort when no engine runs (then there is nothing to remove either)."""
    try:
        c = client()
    except EmuError:
        return []
    removed = []
    for ct in c.containers.list(all=True):
        if _is_ours(ct, prefix) and _prefix_of(ct) not in keep:
            with contextlib.suppress(Exception):
                ct.remove(force=True)
                removed.append(f"container {ct.name}")
    return removed


def missing_mounts(emu, paths: list[str]) -> list[str]:
    """Which of `paths` some host container of `emu` does not bind-mount at the same path."""
    c = client()
    missing: list[str] = []
    for node in emu.backend.nodes.values():
        if node.role != "host" or "container" not in node.extra:
            continue
        have = {m.get("Destination") for m in c.containers.get(node.extra["container"]).attrs.get("Mounts", [])}
        missing += [p for p in paths if p not in missing
                    and not any(d and (p == d or p.startswith(d.rstrip("/") + "/")) for d in have)]
    return missing


def attach_netns(name: str, pid: int) -> None:
    """Name a container's network namespace (/run/netns/NAME), so tc, ip, iptables and netlink reach it
    as they reach the netns backend's nodes."""
    run(["ip", "netns", "attach", name, str(pid)])


def remove_images(names: list[str] | None = None) -> list[str]:
    """Remove the testbed's images (by default the role images, the base and the testbed image); the
    runs never do this themselves: images are kept for the next run."""
    import docker

    c = client()
    names = names or [*sorted({image(r) for r in ROLE_IMAGES}), f"{IMAGE_REPO}/base:bookworm",
                      f"{IMAGE_REPO}/testbed:latest"]
    removed = []
    for name in names:
        with contextlib.suppress(docker.errors.ImageNotFound):
            c.images.remove(name)
            removed.append(f"image {name}")
    return removed

"""Machines for a cluster emulation on one host: Docker containers, each with its own network namespace and Ray
inside, joined by a Docker bridge with jumbo frames (the cluster network). For `make cluster-demo` and the
integration test: the project, its venv and the venv's Python are bind-mounted read-only at the same paths, so
the containers run this checkout's code (the image gives iproute2, tc and iptables: the atlas role image).

Containers on one host share its CLOCK_MONOTONIC; real servers do not. With `clocks`, machine i's Ray (and so its
agent and everything the agent starts) runs in a time namespace of its own whose monotonic clock is `clocks[i]`
seconds ahead of the host's (`unshare --time --monotonic S`, Linux 5.6 and later), as separate servers would.

The containers get every capability but CAP_SYS_RESOURCE, unconfined seccomp and /proc/sys writable, the
capabilities --privileged would give, spelled out for sandboxes that refuse --privileged (docs/containers.md).
"""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from testbed.emu.sh import EmuError

IMAGE = "gdtb/atlas:latest"
SUBNET = "10.250.32.0/24"  # the cluster network: machine i at .10+i
UNDERLAY_MTU = 9100  # VXLAN's 50 bytes on top of the emulation's 9000-byte packets
RAY_PORT = 6379
CAPS = ["--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE", "--security-opt", "seccomp=unconfined",
        "--security-opt", "systempaths=unconfined", "--security-opt", "apparmor=unconfined"]
# iperf3's library and its one dependency the role image lacks (testbed topology check runs iperf3 in the hosts)
HOST_LIBS = ("/usr/lib/x86_64-linux-gnu/libiperf.so.0", "/usr/lib/x86_64-linux-gnu/libsctp.so.1")
RAY_START_S = 180.0
CLOCK_MARGIN_S = 60.0  # a clock set back must still read at least this much (the kernel refuses a negative one)


def docker(*args: str, check: bool = True, timeout: float = 120) -> str:
    try:
        p = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise EmuError("docker not found: sudo make docker-setup") from None
    except subprocess.TimeoutExpired:
        raise EmuError(f"docker {' '.join(args[:2])}: timed out after {timeout:g} s") from None
    if check and p.returncode != 0:
        raise EmuError(f"docker {' '.join(args[:2])}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    return p.stdout


def unavailable() -> str:
    """Why local machines cannot be started here ('' if they can)."""
    if not shutil.which("docker"):
        return "no docker CLI (sudo make docker-setup)"
    if subprocess.run(["docker", "version"], capture_output=True).returncode != 0:
        return "no Docker engine running (sudo make docker-setup, or scripts/dockerd.sh start)"
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        return f"no image {IMAGE} (sudo make docker-setup builds it)"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "no Ray in this venv (pip install -e '.[ray]')"
    return ""


@dataclass(frozen=True)
class LocalCluster:
    prefix: str
    count: int
    subnet: str = SUBNET
    mtu: int = UNDERLAY_MTU
    clocks: tuple[float, ...] = ()  # machine i's CLOCK_MONOTONIC minus the host's (s); none: the host's

    @property
    def network(self) -> str:
        return f"{self.prefix}-net"

    def name(self, i: int) -> str:
        return f"{self.prefix}-m{i}"

    def address(self, i: int) -> str:
        return str(ipaddress.ip_network(self.subnet)[10 + i])

    def names(self) -> list[str]:
        return [self.name(i) for i in range(self.count)]

    def clock_s(self, i: int) -> float:
        return self.clocks[i] if i < len(self.clocks) else 0.0

    def on_clock(self, i: int, argv: list[str]) -> list[str]:
        """`argv` run on machine i's own clock (a time namespace of its own; the host's clock when it has none)."""
        off = self.clock_s(i)
        return argv if off == 0 else ["unshare", "--time", "--monotonic", f"{off:g}", "--fork", *argv]

    def exec(self, i: int, argv: list[str], timeout: float = 600, check: bool = True) -> str:
        return docker("exec", self.name(i), *argv, timeout=timeout, check=check)

    def driver(self, project: Path, argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
        """`argv` run as the cluster's driver: on machine 0, in the project's checkout (mounted at the same path),
        on the host's clock; its exit status and output as they came (a test reads both)."""
        return subprocess.run(["docker", "exec", "-w", str(project), self.name(0), *argv], capture_output=True,
                              text=True, timeout=timeout)

    def leftovers(self, machines: Iterable[int] | None = None, state: bool = False) -> list[str]:
        """What an emulation of this prefix left on the machines (all by default): namespaces and links, and with
        `state` its state file, each line naming its machine."""
        script = (f"ip netns list | grep '^{self.prefix}-' ; ip -o link show | grep -o ' {self.prefix}-[^:@]*' ; "
                  + (f"ls /run/gdtb/{self.prefix}.json 2>/dev/null ; " if state else "") + "true")
        return [f"{self.name(i)}: {ln.strip()}" for i in (range(self.count) if machines is None else machines)
                for ln in self.exec(i, ["sh", "-c", script]).splitlines() if ln.strip()]


def mounts(project: Path, out: Path) -> list[str]:
    """Read-only: the project (and its venv), the venv's Python (unless it is the system's, /usr: the image's
    Debian Python is the same 3.11), iperf3's libraries; read-write: `out`."""
    base = Path(sys.base_prefix)
    paths = [(project, "ro"), *([] if base == Path("/usr") else [(base, "ro")]), (out, "rw")]
    args = []
    for p, mode in paths:
        args += ["-v", f"{p.resolve()}:{p.resolve()}:{mode}"]
    for lib in HOST_LIBS:
        if Path(lib).exists():
            args += ["-v", f"{Path(lib).resolve()}:{lib}:ro"]
    return args


def check_clocks(lc: LocalCluster) -> None:
    """Machines on clocks of their own need time namespaces, and a clock set back must not go below 0."""
    if not any(lc.clock_s(i) for i in range(lc.count)):
        return
    if not Path("/proc/self/ns/time").exists():
        raise EmuError("machines with their own clocks need time namespaces (Linux 5.6+, CONFIG_TIME_NS): drop "
                       "--clocks")
    now = time.monotonic()
    for i in range(lc.count):
        if now + lc.clock_s(i) < CLOCK_MARGIN_S:
            raise EmuError(f"clocks: machine {i} at {lc.clock_s(i):g} s would read {now + lc.clock_s(i):.0f} s, "
                           f"under {CLOCK_MARGIN_S:g} s (this host has been up {now:.0f} s): pick an offset above "
                           f"{CLOCK_MARGIN_S - now:.0f}")


def start(lc: LocalCluster, project: Path, out: Path) -> None:
    """The network, the containers, and Ray: the head on machine 0, the others joining it, each on its own clock
    (`lc.clocks`). On failure the caller stops what exists (stop() is idempotent)."""
    check_clocks(lc)
    docker("network", "create", "--driver", "bridge", "--subnet", lc.subnet, "--opt",
           f"com.docker.network.driver.mtu={lc.mtu}", lc.network)
    for i in range(lc.count):
        docker("run", "-d", "--name", lc.name(i), "--hostname", lc.name(i), "--network", lc.network, "--ip",
               lc.address(i), "--shm-size", "256m", "--label", f"gdtb.cluster={lc.prefix}", *CAPS,
               *mounts(project, out), IMAGE, "sleep", "infinity")
    ray = str(Path(sys.executable).parent / "ray")
    common = ["--num-cpus", "1", "--object-store-memory", str(80 * 2**20), "--disable-usage-stats"]
    lc.exec(0, lc.on_clock(0, [ray, "start", "--head", "--port", str(RAY_PORT), "--node-ip-address", lc.address(0),
                               "--include-dashboard", "false", *common]), timeout=RAY_START_S)
    for i in range(1, lc.count):
        lc.exec(i, lc.on_clock(i, [ray, "start", "--address", f"{lc.address(0)}:{RAY_PORT}", "--node-ip-address",
                                   lc.address(i), *common]), timeout=RAY_START_S)
    wait_nodes(lc, ray)


def wait_nodes(lc: LocalCluster, ray: str) -> None:
    deadline = time.monotonic() + RAY_START_S
    while time.monotonic() < deadline:
        out = lc.exec(0, [ray, "status"], check=False, timeout=60)
        if out.count("node_") >= lc.count:
            return
        time.sleep(2)
    raise EmuError(f"the Ray cluster did not reach {lc.count} nodes within {RAY_START_S:g} s")


@contextlib.contextmanager
def running(lc: LocalCluster, project: Path, out: Path) -> Iterator[LocalCluster]:
    """The machines started (an earlier run's of the same prefix removed first) and removed on the way out."""
    stop(lc)
    try:
        start(lc, project, out)
        yield lc
    finally:
        stop(lc)


def stop(lc: LocalCluster) -> list[str]:
    """Remove the containers and the network (what does not exist is skipped); return what was removed."""
    removed = []
    for n in docker("ps", "-a", "--filter", f"label=gdtb.cluster={lc.prefix}", "--format", "{{.Names}}",
                    check=False).split():
        docker("rm", "-f", n, check=False)
        removed.append(f"container {n}")
    if docker("network", "ls", "-q", "--filter", f"name=^{lc.network}$", check=False).strip():
        docker("network", "rm", lc.network, check=False)
        removed.append(f"network {lc.network}")
    return removed

"""Where each rank of a foreign torch.distributed job runs and the environment it gets. Pure: no side
effects, unit-tested.

Ranks are laid out like torchrun on one node per emulated host: hosts in topology order (every host
of the first DC, then the next DC), `nproc` ranks per host. Each host's rank block is contiguous, so
a DC's ranks are contiguous too. A host's index inside its DC is its *replica*: a job that puts
pipeline replica j on host j of every DC (as examples/pipeline_gpt.py does) lets the testbed tell
its replicas' flows apart on the WAN by port range (see `port_ranges`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.emu.names import AddressPlan, host_name
from testbed.errors import SpecError

LAN_IFNAME = "eth0"  # every backend names an emulated host's interface into its DC this way
EPHEMERAL_LO, EPHEMERAL_HI = 32768, 65535
MAX_PORT_BLOCK = 4096
MIN_PORT_BLOCK = 256
NCCL_MAX_THREADS = 16  # NCCL_SOCKET_NTHREADS is 1..16, and threads x sockets per thread at most 64
NCCL_MAX_SOCKETS = 64


@dataclass(frozen=True)
class Slot:
    rank: int
    local_rank: int
    group_rank: int  # the host's index over all hosts: torchrun's node rank
    host: str  # useast-h0
    dc: str
    replica: int  # the host's index inside its DC
    ns: str
    ip: str


def layout(addr: AddressPlan, nproc: int) -> list[Slot]:
    if nproc < 1:
        raise SpecError("--nproc-per-host", f"{nproc} is not a process count", "use 1 or more")
    out = []
    for g, h in enumerate(addr.hosts):
        for lr in range(nproc):
            out.append(Slot(g * nproc + lr, lr, g, host_name(h), h.dc, h.index, h.ns, h.ip))
    return out


def nccl_striping(connections: int) -> tuple[int, int]:
    """(NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD) giving at least `connections` sockets per peer
    pair (NCCL stripes each transfer over threads x sockets), within NCCL's limits."""
    n = max(1, min(connections, NCCL_MAX_SOCKETS))
    threads = min(n, NCCL_MAX_THREADS)
    return threads, math.ceil(n / threads)


def port_ranges(addr: AddressPlan) -> dict[str, tuple[int, int]]:
    """Each host's ephemeral port range (net.ipv4.ip_local_port_range is per network namespace): one
    aligned power-of-two block per host, so one u32 match classifies a host's ports."""
    n = len(addr.hosts)
    block = MAX_PORT_BLOCK
    while block * n > EPHEMERAL_HI + 1 - EPHEMERAL_LO:
        block //= 2
    if block < MIN_PORT_BLOCK:
        raise SpecError("topology", f"{n} emulated hosts leave fewer than {MIN_PORT_BLOCK} ports each",
                        "emulate fewer hosts per DC")
    return {h.ns: (EPHEMERAL_LO + i * block, EPHEMERAL_LO + (i + 1) * block - 1) for i, h in enumerate(addr.hosts)}


def device_env(slot: Slot, gpus: list[str], in_container: bool) -> dict[str, str]:
    """A GPU host's pinned device. Bare namespaces see every GPU: each rank gets one, round-robin by rank,
    through CUDA_VISIBLE_DEVICES. A host container was given its GPU at creation (`--gpus device=N`), so
    there the rank uses the one it sees. TESTBED_DEVICE names the torch device either way."""
    if not gpus:
        return {"TESTBED_DEVICE": "cpu"}
    if in_container:
        return {"TESTBED_DEVICE": "cuda:0"}
    return {"CUDA_VISIBLE_DEVICES": gpus[slot.rank % len(gpus)], "TESTBED_DEVICE": "cuda:0"}


def rank_env(slot: Slot, slots: list[Slot], *, master_port: int, connections: int, dcs: list[str],
             gpus: list[str], in_container: bool, out_dir: str, threads: int, scale: float = 1.0,
             links_file: str = "") -> dict[str, str]:
    """torchrun's environment for one rank, on the emulated network, plus the testbed's own: TESTBED_SCALE is
    the WAN's k (a scale model divides its message sizes by it), TESTBED_LINKS the file with each WAN link
    as the spec has it and as emulated (testbed.launch.dilation.links_table)."""
    master = slots[0]
    nproc = sum(1 for s in slots if s.group_rank == 0)
    nthreads, nsocks = nccl_striping(connections)
    env = {
        "MASTER_ADDR": master.ip, "MASTER_PORT": str(master_port),
        "RANK": str(slot.rank), "WORLD_SIZE": str(len(slots)),
        "LOCAL_RANK": str(slot.local_rank), "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": str(slot.group_rank), "GROUP_WORLD_SIZE": str(len(slots) // nproc),
        "ROLE_RANK": str(slot.rank), "ROLE_WORLD_SIZE": str(len(slots)), "ROLE_NAME": "default",
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "testbed",
        "OMP_NUM_THREADS": str(threads),
        # gloo and NCCL's socket transport: the emulated host's interface, so traffic crosses the WAN
        "GLOO_SOCKET_IFNAME": LAN_IFNAME, "NCCL_SOCKET_IFNAME": LAN_IFNAME,
        # Atlas's multi-TCP for NCCL: each transfer striped over threads x sockets
        "NCCL_SOCKET_NTHREADS": str(nthreads), "NCCL_NSOCKS_PERTHREAD": str(nsocks),
        # every emulated host is its own node to NCCL (one machine hosts them all): no shared memory or
        # P2P shortcut between hosts, no InfiniBand; only sockets, which the emulated WAN carries
        "NCCL_HOSTID": slot.ns, "NCCL_IB_DISABLE": "1",
        "TESTBED_DC": slot.dc, "TESTBED_HOST": slot.host, "TESTBED_REPLICA": str(slot.replica),
        "TESTBED_DCS": ",".join(dcs), "TESTBED_OUT": out_dir, "TESTBED_SCALE": f"{scale:g}",
    }
    if links_file:
        env["TESTBED_LINKS"] = links_file
    env.update(device_env(slot, gpus, in_container))
    return env


def omp_threads(cpus: int, world: int) -> int:
    """One machine runs every rank: share its cores (torchrun sets 1 when it starts several per node)."""
    return max(1, cpus // max(1, world))

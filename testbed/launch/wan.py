"""The emulated WAN a launch runs on: one already up under the prefix, or one built for the launch
(and torn down after it). A launch accepts a topology YAML or an experiment YAML (its topology and
its `emulation:` settings)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from testbed.emu import state
from testbed.emu.build import Emulation
from testbed.emu.sh import EmuError
from testbed.errors import SpecError
from testbed.spec.experiment import Experiment, NetworkOptions
from testbed.spec.topology import Topology


@dataclass
class LaunchSpec:
    topology: Topology
    backend: str
    prefix: str
    scale: float  # 0: auto (the smallest k this machine carries, from a headroom probe)
    delay: str
    max_connections: int


def load_spec(path: Path, sets: list[str] | None, backend: str | None, prefix: str | None,
              scale: float | None) -> LaunchSpec:
    """A topology YAML (it has `dcs:`) or an experiment YAML (it has `topology:`)."""
    from testbed.spec.load import _read_yaml, load_experiment, load_topology

    data = _read_yaml(path)
    if "dcs" in data:
        topo, em, max_conns = load_topology(path, sets), None, NetworkOptions().max_tcp_connections
    elif "topology" in data:
        exp: Experiment = load_experiment(path, sets)[0][0]
        topo, em, max_conns = exp.topology, exp.emulation, exp.network.max_tcp_connections
    else:
        raise SpecError(str(path), "neither a topology (no `dcs:`) nor an experiment (no `topology:`)",
                        "pass a topology or an experiment YAML")
    from testbed.emu.names import DEFAULT_PREFIX, check_prefix

    be = backend or (em.backend if em else "netns")
    if be == "mininet":
        raise SpecError("--backend", "launch runs on netns, docker or containernet", "pick one of those")
    return LaunchSpec(topo, be, check_prefix(prefix or (em.prefix if em else None) or DEFAULT_PREFIX),
                      scale if scale is not None else (em.scale if em else 0.0), em.delay if em else "auto", max_conns)


def parse_scale(text: str | None) -> float | None:
    """`--scale auto` (0) or a positive number; None when not given."""
    if text is None:
        return None
    if text.strip().lower() == "auto":
        return 0.0
    try:
        k = float(text)
    except ValueError:
        raise SpecError("--scale", f"{text!r} is neither auto nor a number",
                        "use --scale auto or e.g. --scale 50") from None
    if not k > 0:
        raise SpecError("--scale", f"{text} is not a positive scale factor", "use --scale auto or e.g. --scale 50")
    return k


def auto_scale(spec: LaunchSpec, nproc: int, say) -> float:
    """The smallest k this machine carries for the topology and rank count, from a probe of its headroom. Without
    GPUs the job's backend is gloo (one connection per rank pair); with them NCCL's sockets may stripe."""
    from testbed.emu.containers import gpu_ids
    from testbed.emu.scale import HEADROOM_SHARE, choose_scale
    from testbed.emu.wan_headroom import probe

    ranks = {d.name: d.hosts * nproc for d in spec.topology.dcs}
    room = probe(spec.prefix, spec.delay)
    nccl = bool(gpu_ids())
    k = choose_scale(spec.topology, room.ceiling_bps, ranks, spec.max_connections if nccl else None)
    say(f"--scale auto: {room.describe()}; k={k:g} keeps the WAN within {HEADROOM_SHARE:.0%} of it with "
        f"{sum(ranks.values())} ranks all talking at once ({'NCCL sockets' if nccl else 'gloo'})")
    return k


def refuse_on_cluster(backend: str, capture: bool, check: bool, sharing: str) -> None:
    """What `launch --cluster` cannot do yet, refused before anything is built."""
    from testbed.errors import NotYetError

    if backend != "netns":
        raise NotYetError(f"launch --cluster with --backend {backend}: not yet; a cluster builds netns on each machine")
    for flag, on in (("--capture", capture), ("--check", check)):
        if on:
            raise NotYetError(f"launch --cluster with {flag}: not yet; a capture runs on one machine (docs/cluster.md)")
    if sharing != "fair":
        raise NotYetError(f"launch --cluster with --sharing {sharing}: not yet (docs/cluster.md)")


def bring_up(spec: LaunchSpec, mounts: list[str], nproc: int = 1, say=print) -> tuple[Emulation, bool]:
    """(the WAN, whether this launch built it). A WAN already up under the prefix is used as it is, if it
    is the same topology on the same backend. (On a cluster: testbed/cluster/launch.py bring_up_cluster.)"""
    from testbed.emu.build import up

    st = state.load(spec.prefix)
    if st is None:
        k = spec.scale or auto_scale(spec, nproc, say)
        return up(spec.topology, backend=spec.backend, prefix=spec.prefix, scale=k, delay=spec.delay,
                  mounts=mounts), True
    from testbed.emu.attach import attach

    emu = attach(spec.prefix)
    if emu.topo != spec.topology or emu.backend.name != spec.backend:
        raise EmuError(f"{spec.prefix} is up with topology {emu.topo.name} on {emu.backend.name}, not this one; "
                       f"`testbed topology down --prefix {spec.prefix}` or pick another --prefix")
    if emu.backend.name == "docker":
        from testbed.emu.containers import missing_mounts

        missing = missing_mounts(emu, mounts)
        if missing:
            raise EmuError(f"the containers of {spec.prefix} do not mount {missing[0]}; let `testbed launch` build the "
                           f"WAN (it mounts the working and output folders), or run from a mounted folder")
    return emu, False


def connections(emu: Emulation, max_connections: int) -> int:
    """The plan's connection count (Atlas's multi-TCP: the fewest connections whose windows cover a link's
    bandwidth-delay product), on the network as emulated; the most any link needs, since NCCL's socket
    settings are one per process."""
    from testbed.plan.network import covering_connections

    return covering_connections(emu.net, max_connections)

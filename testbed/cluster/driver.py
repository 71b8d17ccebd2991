"""The driver's side of a cluster emulation (run on one node of the Ray cluster): the machines, an agent on each
(testbed/cluster/machine.py, pinned to its node), their parts built in parallel, and an Emulation whose backend
runs each command on the machine that holds the namespace, so the single-machine checks (testbed/emu/check.py)
measure the tunnels unchanged. A machine that dies ends what is running with an error naming it."""

from __future__ import annotations

import contextlib
import itertools
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from testbed.cluster import clock
from testbed.cluster.machine import MachineAgent, code_fingerprint
from testbed.cluster.placement import ClusterPlan, plan_cluster
from testbed.emu.backends.base import Backend, Node
from testbed.emu.build import Emulation, window_notes
from testbed.emu.names import address_plan
from testbed.emu.sh import EmuError
from testbed.errors import NotYetError
from testbed.spec.cluster import Cluster, Machine
from testbed.spec.topology import Topology

CALL_TIMEOUT_S = 300.0  # one agent call (a part's build, a measurement)


def _ray():
    try:
        import ray
    except ImportError:
        raise EmuError("--cluster needs Ray: pip install -e '.[ray]' on every machine") from None
    return ray


def connect(cluster: Cluster) -> list[Machine]:
    """Join the Ray cluster; the machines, each checked to be an alive node (default: every alive node)."""
    machines, gone = reachable(cluster)
    if gone:
        raise EmuError(gone[0])
    return machines


def reachable(cluster: Cluster) -> tuple[list[Machine], list[str]]:
    """Join the Ray cluster; the listed machines that are alive nodes, and a line naming each one that is not."""
    ray = _ray()
    if not ray.is_initialized():
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            ray.init(address=cluster.ray_address, log_to_driver=False, logging_level="ERROR")
        except (ConnectionError, RuntimeError) as e:
            raise EmuError(f"no Ray cluster at {cluster.ray_address}: {e}; run testbed on a node of the cluster "
                           f"(ray start --address HEAD:6379 there)") from None
        finally:  # Ray's core worker installs its own SIGTERM handler, which exits at once: `kill` must tear down
            for sig, handler in handlers.items():
                if callable(handler):
                    signal.signal(sig, handler)
    nodes = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
    if not cluster.machines:
        return [Machine(name=f"m{i}", address=ip) for i, ip in enumerate(nodes)], []
    listed = ", ".join(nodes) or "none"
    gone = [f"machine {m.name} ({m.address}) is not an alive node of the Ray cluster (nodes: {listed}); start Ray "
            f"there: ray start --address HEAD:6379" for m in cluster.machines if m.address not in nodes]
    return [m for m in cluster.machines if m.address in nodes], gone


@dataclass
class Agents:
    """One agent per machine, and calls to them that name the machine when it fails or dies."""

    machines: dict[str, Machine]
    handles: dict[str, object]
    driver_address: str = ""  # this driver's Ray node address (its workers reach the control socket directly)
    clocks: dict[str, clock.ClockOffset] = field(default_factory=dict)  # each machine's clock against the driver's

    def measure_clocks(self) -> dict[str, clock.ClockOffset]:
        """Each machine's CLOCK_MONOTONIC against the driver's (testbed/cluster/clock.py)."""
        return clock.measure(list(self.handles), lambda name: self.call(name, "clock", timeout=30))

    def offset_s(self, name: str) -> float:
        """Machine `name`'s clock minus the driver's (0 where it shares it, or was not measured)."""
        c = self.clocks.get(name)
        return c.offset_s if c is not None else 0.0

    def call(self, name: str, method: str, *args, timeout: float = CALL_TIMEOUT_S):
        return self.gather({name: (method, args)}, timeout)[name]

    def gather(self, calls: dict[str, tuple[str, tuple]], timeout: float = CALL_TIMEOUT_S) -> dict:
        """Run calls on several machines at once; the first failure (in machine order) raises, naming it."""
        out, errors = self.gather_all(calls, timeout)
        if errors:
            raise EmuError(errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
        return out

    def gather_all(self, calls: dict[str, tuple[str, tuple]],
                   timeout: float = CALL_TIMEOUT_S) -> tuple[dict, list[str]]:
        """Run calls on several machines at once: the answers, and a line naming each machine that failed."""
        ray = _ray()
        refs = {n: getattr(self.handles[n], m).remote(*a) for n, (m, a) in calls.items()}
        out, errors = {}, []
        for n, ref in refs.items():
            try:
                out[n] = ray.get(ref, timeout=timeout)
            except Exception as e:  # noqa: BLE001 - every failure is reported with its machine
                errors.append(self.describe(n, e))
        return out, errors

    def describe(self, name: str, e: Exception) -> str:
        ray, m = _ray(), self.machines[name]
        if isinstance(e, ray.exceptions.RayTaskError):
            cause = e.as_instanceof_cause()
            if isinstance(cause, subprocess.TimeoutExpired):
                raise cause from None  # the caller's own timeout (RemoteProcess.wait)
            return f"machine {name} ({m.address}): {getattr(cause, 'args', [cause])[0] if cause.args else cause}"
        if isinstance(e, ray.exceptions.GetTimeoutError):
            return f"machine {name} ({m.address}) did not answer within the call's timeout"
        return f"machine {name} ({m.address}) died or left the cluster ({type(e).__name__})"

    def check_alive(self) -> None:
        """Raise, naming it, if a machine's agent is gone."""
        self.gather({n: ("info", ()) for n in self.handles}, timeout=30)


def start_agents(machines: list[Machine]) -> Agents:
    """An agent on each machine, pinned to its Ray node (the node:<address> resource), checked to run as root."""
    ray = _ray()
    remote = ray.remote(num_cpus=0, max_restarts=0)(MachineAgent)
    handles = {m.name: remote.options(resources={f"node:{m.address}": 0.001}, name=None)
               .remote(m.name, sys.executable) for m in machines}
    ray = _ray()
    here = ray.util.get_node_ip_address()
    agents = Agents({m.name: m for m in machines}, handles, here)
    here = code_fingerprint()
    for name, info in agents.gather({n: ("info", ()) for n in handles}, timeout=120).items():
        if info["code"] != here:
            raise EmuError(f"machine {name} runs other testbed code ({info['code']}, here {here}): install the same "
                           f"checkout on every machine")
        if info["euid"] != 0:
            raise EmuError(f"machine {name}: Ray runs as uid {info['euid']} there; the emulation needs root "
                           f"(start Ray as root on every machine)")
    return agents


class RemoteStderr:
    """A finished remote process's stderr, read through its agent."""

    def __init__(self, proc: RemoteProcess) -> None:
        self.proc = proc

    def read(self) -> str:
        return self.proc.agents.call(self.proc.machine, "stderr", self.proc.pid)


class RemoteProcess:
    """A process an agent started: what testbed/emu/check.py needs of a subprocess.Popen."""

    def __init__(self, agents: Agents, machine: str, pid: int) -> None:
        self.agents, self.machine, self.pid, self.returncode = agents, machine, pid, None
        self.stderr = RemoteStderr(self)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        out, err, self.returncode = self.agents.call(self.machine, "communicate", self.pid, timeout)
        return out, err

    def wait(self, timeout: float | None = None) -> int:
        self.communicate(timeout)
        return self.returncode  # type: ignore[return-value]

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.agents.call(self.machine, "poll", self.pid)
        return self.returncode

    def kill(self) -> None:
        self.agents.call(self.machine, "kill", self.pid)

    def terminate(self) -> None:
        self.agents.call(self.machine, "terminate", self.pid)


class RemoteSidecar(RemoteProcess):
    """An Atlas sidecar on a machine of the cluster; once it has ended, its last lines (class changes, notices
    forwarded, reaction times) are printed here, naming its link and machine (its log stays on that machine)."""

    def __init__(self, agents: Agents, machine: str, pid: int, what: str) -> None:
        super().__init__(agents, machine, pid)
        self.what = what

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        out, err = super().communicate(timeout)
        self.agents.call(self.machine, "close_side_relays")
        for line in (err or "").strip().splitlines()[-3:]:
            print(f"Atlas sidecar {self.what} on {self.machine}: {line}", file=sys.stderr)
        return out, err


class ClusterBackend(Backend):
    """Commands in a namespace run on the machine that holds it (a link's WAN namespace: its first DC's)."""

    name = "cluster"
    persistent = False  # the agents live with the driver

    def __init__(self, prefix: str, plan: ClusterPlan, agents: Agents, topo: Topology) -> None:
        super().__init__(prefix)
        self.agents = agents
        addr = self.addr = address_plan(topo, prefix)
        for h in addr.hosts:
            self.nodes[h.ns] = Node(h.ns, "host", ns=h.ns, extra={"machine": plan.dc_machine[h.dc]})
        for dc, (ns, _) in addr.gateways.items():
            self.nodes[ns] = Node(ns, "gateway", ns=ns, extra={"machine": plan.dc_machine[dc]})
        for w in addr.wans:  # a link split between two machines has a WAN namespace on each: no one machine
            a, b = plan.dc_machine[w.a], plan.dc_machine[w.b]
            # the device towards a DC is in the half that sends to it: the other DC's machine
            self.nodes[w.ns] = Node(w.ns, "wan", ns=w.ns, extra={"machine": a if a == b else None,
                                                                  "by_dev": {w.a: b, w.b: a}})

    def machine(self, node: Node, argv: list[str] | None = None) -> str:
        """The machine that runs `argv` in `node`: a tunnelled link's WAN namespace by the device it names."""
        if node.extra["machine"] is not None:
            return node.extra["machine"]
        for flag, value in itertools.pairwise(argv or []):
            if flag in ("dev", "-o") and value in node.extra["by_dev"]:
                return node.extra["by_dev"][value]
        raise EmuError(f"{node.name} is split between two machines and {' '.join((argv or ['a process'])[:3])} names "
                       f"no device of it: not yet supported")

    def clock_offset_s(self, node: Node) -> float:
        """The clock of the machine holding `node` (a host or gateway) minus the driver's."""
        return self.agents.offset_s(self.machine(node))

    def run(self, node: Node, argv: list[str], **kw) -> str:
        return self.agents.call(self.machine(node, argv), "run", node.ns, argv, kw.get("check", True),
                                kw.get("timeout"))

    def popen(self, node: Node, argv: list[str], **kw) -> RemoteProcess:  # type: ignore[override]
        machine = self.machine(node)
        return RemoteProcess(self.agents, machine, self.agents.call(machine, "popen", node.ns, argv))

    def spawn(self, node, module, args, **kw):  # type: ignore[override]
        """A role process on the node's machine, the run's files among `args` (configs) copied there first."""
        from testbed.emu import state

        if node is None or module != "testbed.runtime.worker":  # Atlas' sidecars start through start_sidecar
            raise NotYetError(f"{module} on a cluster: not yet (workers and Atlas sidecars only: BubbleTea's service "
                              f"and decoders talk over one machine's Unix socket; docs/cluster.md)")
        files = {a: Path(a).read_text() for a in args if Path(a).is_file() and state.STATE_DIR in Path(a).parents}
        machine = self.machine(node)
        return RemoteProcess(self.agents, machine, self.agents.call(machine, "spawn", node.ns, module, args, files))

    def start_sidecar(self, node: Node, cfg: dict) -> list[RemoteSidecar]:
        """A WAN link's Atlas sidecar on its machine; a split link's, one per half on the machine whose device it
        shapes, each half's end notices carried to the other (testbed/runtime/sidecar.py `forward`,
        testbed/cluster/relay.py) with a secret made for the link."""
        import secrets

        from testbed.emu import state

        w = next(w for w in self.addr.wans if w.ns == node.ns)
        rdir = state.run_dir(self.prefix)
        fwd = str(rdir / f"sidecar-{node.ns}.fwd.sock")
        if node.extra["machine"] is not None:
            halves = {node.extra["machine"]: cfg}
        else:  # a half whose device has no classes runs no sidecar; then the other half forwards nothing
            split = len(cfg["devs"]) == 2
            halves = {node.extra["by_dev"][dev]: {**cfg, "devs": {dev: classes}, **({"forward": fwd} if split else {})}
                      for dev, classes in cfg["devs"].items()}
            if split:  # a forwarded end's times move onto the other half's clock (testbed/runtime/sidecar.py)
                for here, there in itertools.permutations(halves):
                    halves[here]["forward_clock_s"] = self.agents.offset_s(there) - self.agents.offset_s(here)
        procs = []
        for machine, half in halves.items():
            pid = self.agents.call(machine, "spawn_sidecar", node.ns, half, str(rdir / f"sidecar-{node.ns}.json"),
                                   half["gid"])
            procs.append(RemoteSidecar(self.agents, machine, pid, f"{w.a}-{w.b}"))
        if len(halves) == 2:
            secret = secrets.token_hex(16)
            for here, there in itertools.permutations(halves):
                inbox = self.agents.call(here, "sidecar_inbox", cfg["socket"], self.agents.machines[here].address,
                                         there, self.agents.machines[there].address, secret)
                self.agents.call(there, "sidecar_outbox", fwd, inbox, secret)
        return procs

    def delay_stats(self) -> dict[str, dict]:
        """`link|machine` -> the stats of that machine's delay line of the link (each half delays one direction)."""
        out = {}
        for machine, by_ns in self.agents.gather({n: ("delay_stats", ()) for n in self.agents.handles}).items():
            for ns, stats in by_ns.items():
                link = next(f"{w.a}-{w.b}" for w in self.addr.wans if w.ns == ns)
                out[f"{link}|{machine}"] = stats
        return out

    def control_relay(self, controller):
        """Every other machine's agent carries its workers' control connections to `controller` over the cluster
        network (testbed/cluster/relay.py), with a secret made for this run."""
        import secrets

        from testbed.cluster.relay import DriverRelay

        here = self.agents.driver_address
        others = {n: m.address for n, m in self.agents.machines.items() if m.address != here}
        relay = DriverRelay(here, others, secrets.token_hex(16), controller.vouch)
        self.agents.gather({n: ("relay", (controller.path, tuple(relay.address), relay.secret)) for n in others})
        return ClusterRelay(self.agents, list(others), relay)

    def add_node(self, name: str, role: str) -> Node:
        raise EmuError("a cluster's nodes are built by its machines' agents")

    def link(self, a: Node, a_if: str, b: Node, b_if: str, mtu: int) -> None:
        raise EmuError("a cluster's links are built by its machines' agents")

    def attach_lan(self, index: int, gw: Node, hosts: list[Node], mtu: int) -> str:
        raise EmuError("a cluster's LANs are built by its machines' agents")

    def argv(self, node: Node, argv: list[str]) -> list[str]:
        raise EmuError("a cluster node's commands run through its machine's agent")

    def teardown(self) -> None:
        self.nodes.clear()


class ClusterRelay:
    def __init__(self, agents: Agents, machines: list[str], relay) -> None:
        self.agents, self.machines, self.relay = agents, machines, relay

    def close(self) -> None:
        self.relay.close()
        with contextlib.suppress(EmuError):
            self.agents.gather({n: ("close_relay", ()) for n in self.machines}, timeout=30)


def up(topo: Topology, cluster: Cluster, prefix: str, scale: float, delay: str = "auto", **kw) -> Emulation:
    """Every machine's part built at once; any failure tears every machine's part down and names the machine.
    `kw`: testbed/emu/build.py up's host settings (lan_gpus_per_host, congestion control, ...)."""
    machines = connect(cluster)
    plan = plan_cluster(topo, cluster, machines)
    agents = start_agents([m for m in machines if m.name in plan.parts])
    agents.clocks = agents.measure_clocks()  # before anything is built: a clock known too roughly is refused
    clock.check(agents.clocks)
    if not all(c.shared for c in agents.clocks.values()):
        print(clock.describe(agents.clocks), file=sys.stderr)
    calls = {n: ("up", (topo.model_dump(mode="json"), part, prefix, scale, delay, cluster.vxlan_port, kw))
             for n, part in plan.parts.items()}
    try:
        built = agents.gather(calls)
    except BaseException:
        down_all(agents)
        raise
    delays = {b["delay"] for b in built.values()}
    if len(delays) > 1:
        down_all(agents)
        raise EmuError(f"the machines delay packets differently ({', '.join(sorted(delays))}); pass --delay nfqueue")
    backend = ClusterBackend(prefix, plan, agents, topo)
    emu = Emulation(prefix, topo, backend, address_plan(topo, prefix), scale, delays.pop(), window_notes(topo, scale),
                    realtime=kw.get("realtime", "auto"))
    emu.cluster_plan = plan  # type: ignore[attr-defined]
    return emu


def down_all(agents: Agents) -> list[str]:
    """Tear every machine's part down; a machine that fails or is gone is named, the others still clean up."""
    errors = []
    for name in agents.handles:
        try:
            agents.call(name, "down", timeout=120)
        except EmuError as e:
            errors.append(str(e))
    return errors


def down(emu: Emulation) -> list[str]:
    """Tear every machine's part down, first warning of a clock that drifted from the driver's during the run."""
    agents: Agents = emu.backend.agents  # type: ignore[attr-defined]
    if agents.clocks:
        with contextlib.suppress(EmuError):  # a machine that died is named by the tear-down
            for line in clock.drift(agents.clocks, agents.measure_clocks()):
                print(f"warning: {line}", file=sys.stderr)
    return down_all(agents)


def dead_nodes() -> list[str]:
    """Addresses of the nodes Ray has marked dead (and that are not alive again under the same address)."""
    nodes = _ray().nodes()
    alive = {n["NodeManagerAddress"] for n in nodes if n["Alive"]}
    return sorted({n["NodeManagerAddress"] for n in nodes if not n["Alive"]} - alive)


def clean(cluster: Cluster, prefix: str | None, force: bool,
          warnings: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """`testbed clean` on every machine that is alive: (machine name -> what it removed, a line per machine that
    could not be cleaned). A dead machine does not stop the others' clean-up (its kernel state died with it; files
    under /run/gdtb stay until `testbed clean` runs there)."""
    machines, errors = reachable(cluster)
    if not cluster.machines:  # every alive node: a dead one was never named by the user, so it only warns
        warnings.extend(f"Ray lists node {ip} as dead: not cleaned (a machine that died took its namespaces and "
                        f"links with it; run `testbed clean` there if it comes back)" for ip in dead_nodes())
    removed: dict[str, list[str]] = {}
    # a machine the user listed and that fails is an error; an unlisted node (every alive node) only warns, like
    # one Ray already marks dead: Ray may list a node that just died as alive for a while
    failed = errors if cluster.machines else warnings
    for m in machines:  # one agent each: a machine that Ray still lists but that died fails alone
        try:
            removed[m.name] = start_agents([m]).call(m.name, "clean", prefix, force)
        except EmuError as e:
            failed.append(f"not cleaned: {e}" if failed is warnings else str(e))
        except Exception as e:  # noqa: BLE001 - Ray's own errors for a node it has just marked dead
            failed.append(f"{'not cleaned: ' if failed is warnings else ''}machine {m.name} ({m.address}) died or "
                          f"left the cluster ({type(e).__name__})")
    return removed, errors


def leftovers(cluster: Cluster, prefix: str) -> dict[str, list[str]]:
    agents = start_agents(connect(cluster))
    return agents.gather({n: ("leftovers", (prefix,)) for n in agents.handles})


def shutdown() -> None:
    with contextlib.suppress(Exception):
        _ray().shutdown()

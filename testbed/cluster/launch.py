"""`testbed launch --cluster`: a foreign torch.distributed job on a WAN spread over a cluster's machines
(testbed/cluster/driver.py). Every emulated host's ranks start on the machine that holds its DC, through that
machine's agent (testbed/cluster/ranks.py), with the environment a single-machine launch gives them
(testbed/launch/ranks.py `rank_env`; OMP threads and GPUs from that machine's own cores and GPUs). The driver polls
every machine for its ranks' output and exits: lines are printed and logged behind `[r<rank> <host>]` as on one
machine; the first rank that fails stops every machine's ranks; so do Ctrl-C and a machine that dies (named).

What reaches the machines: the command, and each argument that names a file here (`carried_files`: a Python
script with the .py files beside it, its local imports); a machine whose same path holds the same bytes runs it in
place. TESTBED_OUT is the same path on every machine; what the ranks wrote there on a machine that does not share
the folder with the driver is brought back once they have ended (`fetch_outputs`).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from testbed.cluster.ranks import Carried
from testbed.errors import NotYetError, SpecError
from testbed.launch.ranks import Slot, device_env, layout, omp_threads, rank_env
from testbed.launch.run import GRACE_S, PYTHONS, LaunchResult, RankExit, describe

POLL_S = 0.2
MAX_OUTPUT_BYTES = 256 * 2**20  # what one machine's ranks wrote under TESTBED_OUT, brought back
FORWARDED_PREFIXES = ("NCCL_", "GLOO_", "TORCH_")  # the driver's settings of the job's libraries reach every rank
MAX_CARRY_BYTES = 4 * 2**20  # a file and the files carried beside it, in all
MAX_SIBLINGS = 64


def carried_files(argv: list[str], cwd: str) -> list[Carried]:
    """Each argument that names a regular file (relative to `cwd`), with, for a `.py` file, the `.py` files in its
    folder (what `import` finds beside a script); the interpreter itself (argv[0] `python`) is the machine's own."""
    out = []
    for i, a in enumerate(argv):
        if i == 0 and a in PYTHONS:
            continue
        p = Path(cwd, a)
        if not p.is_file():
            continue
        p = p.resolve()
        files = {p.name: p.read_bytes()}
        if p.suffix == ".py":
            for s in sorted(p.parent.glob("*.py"))[:MAX_SIBLINGS]:
                if s.name not in files and s.is_file():
                    files[s.name] = s.read_bytes()
        total = sum(len(b) for b in files.values())
        if total > MAX_CARRY_BYTES:
            raise SpecError(f"command argument {a}", f"{total / 2**20:.1f} MiB with the files beside it, over the "
                            f"{MAX_CARRY_BYTES / 2**20:.0f} MiB carried to each machine",
                            "put large inputs on every machine and pass their path")
        out.append(Carried(i, str(p), files))
    return out


def forwarded_env(environ: dict[str, str]) -> dict[str, str]:
    """The driver's variables every rank gets (NCCL_DEBUG, TORCH_DISTRIBUTED_DEBUG, ...): the rest of a rank's
    environment is its machine's (its agent's, without Ray's settings)."""
    return {k: v for k, v in environ.items() if k.startswith(FORWARDED_PREFIXES)}


def rank_envs(slots: list[Slot], where: dict[int, str], resources: dict[str, dict], *, master_port: int,
              connections: int, dcs: list[str], out_dir: str, scale: float, links_file: str,
              forwarded: dict[str, str] | None = None) -> dict[int, dict]:
    """Each rank's environment: `forwarded` (the driver's), then `rank_env` with its machine's cores shared among
    that machine's ranks and its machine's GPUs given round-robin to them (`resources`: machine -> {"cpus": n,
    "gpus": [index, ...]})."""
    envs = {}
    for m, res in resources.items():
        mine = [s for s in slots if where[s.rank] == m]
        threads = omp_threads(res["cpus"], len(mine))
        for i, s in enumerate(mine):
            env = rank_env(s, slots, master_port=master_port, connections=connections, dcs=dcs, gpus=res["gpus"],
                           in_container=False, out_dir=out_dir, threads=threads, scale=scale, links_file=links_file)
            env.update(device_env(replace(s, rank=i), res["gpus"], in_container=False))
            envs[s.rank] = {**(forwarded or {}), **env}
    return envs


def run_cluster_job(emu, argv: list[str], *, nproc: int = 1, master_port: int = 29500, connections: int = 1,
                    out_dir: Path, cwd: str, echo: Callable[[str], None] = print, capture=None,
                    on_failure: Callable[[str], None] | None = None, links_file: str = "") -> LaunchResult:
    """testbed.launch.run `run_job` on a cluster: start every rank on its DC's machine, stream their output, stop
    every machine's ranks when one fails (or on Ctrl-C, or when a machine dies); no rank is left behind."""
    if capture is not None:
        raise NotYetError("launch --cluster with --capture: not yet; a capture runs on one machine (docs/cluster.md)")
    agents, plan = emu.backend.agents, emu.cluster_plan
    slots = layout(emu.addr, nproc)
    by_rank = {s.rank: s for s in slots}
    where = {s.rank: plan.dc_machine[s.dc] for s in slots}
    machines = [m for m in agents.handles if m in set(where.values())]
    resources = agents.gather({m: ("launch_resources", ()) for m in machines})
    out_dir.mkdir(parents=True, exist_ok=True)
    envs = rank_envs(slots, where, resources, master_port=master_port, connections=connections,
                     dcs=[d.name for d in emu.topo.dcs], out_dir=str(out_dir.resolve()), scale=emu.scale,
                     links_file=links_file, forwarded=forwarded_env(dict(os.environ)))
    extra = {links_file: Path(links_file).read_bytes()} if links_file else {}
    carried = carried_files(argv, cwd)
    marker = out_dir / f".testbed-launch-{uuid.uuid4().hex[:12]}"  # a machine that sees it shares the folder
    marker.touch()
    results: dict[int, RankExit] = {}
    failed: RankExit | None = None
    log = open(out_dir / "launch.log", "w")  # noqa: SIM115 (closed below)

    def say(line: str) -> None:  # one thread: lines come from the polls, in order
        echo(line)
        log.write(line + "\n")

    def show(lines: list[tuple[int, str]]) -> None:
        for rank, text in lines:
            say(f"[r{rank} {by_rank[rank].host}] {text}")

    stop_errors: list[str] = []
    try:
        try:
            calls = {m: ("start_ranks", ([s for s in slots if where[s.rank] == m], argv, envs, cwd, carried, extra))
                     for m in machines}
            for m, notes in agents.gather(calls).items():
                for n in notes:
                    say(f"[{m}] {n}")
            failed = follow(agents, machines, by_rank, results, show)
            if failed is not None:
                pending = len(slots) - len(results)
                msg = (f"rank {failed.slot.rank} ({failed.slot.host}, {failed.slot.dc} on machine "
                       f"{where[failed.slot.rank]}) exited with {describe(failed.code)}; stopping the other "
                       f"{pending} rank(s)")
                (on_failure or say)(msg)
        finally:
            stop_errors = stop_everywhere(agents, machines, by_rank, results, show)
            log.close()
        if stop_errors:
            from testbed.emu.sh import EmuError

            raise EmuError(f"stopping the ranks: {stop_errors[0]}")
        for line in fetch_outputs(agents, machines, out_dir, marker.name):
            echo(line)
    finally:
        marker.unlink(missing_ok=True)
    return LaunchResult([results[s.rank] for s in slots], failed)


def fetch_outputs(agents, machines: list[str], out_dir: Path, marker: str) -> list[str]:
    """Bring what the ranks wrote under TESTBED_OUT on machines that do not share the folder into it here: a file
    this launch's driver already holds with other bytes lands beside it as NAME.MACHINE. A line per machine."""
    got = agents.gather({m: ("rank_outputs", (str(out_dir.resolve()), marker, MAX_OUTPUT_BYTES))
                         for m in machines})
    lines = []
    for m, (files, left) in got.items():
        for rel, data in files.items():
            dest = out_dir / rel
            if dest.is_file() and dest.read_bytes() != data:
                dest = dest.with_name(f"{dest.name}.{m}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        if files or left:
            lines.append(f"[{m}] brought back {len(files)} file(s) the ranks wrote under {out_dir}"
                         + (f"; left there (over {MAX_OUTPUT_BYTES // 2**20} MiB): {', '.join(left)}" if left else ""))
    return lines


def follow(agents, machines: list[str], by_rank: dict[int, Slot], results: dict[int, RankExit],
           show: Callable[[list[tuple[int, str]]], None]) -> RankExit | None:
    """Poll every machine until every rank has exited or one has failed (returned); `results` fills as they exit.
    A machine that dies or fails to answer raises, naming it."""
    while len(results) < len(by_rank):
        time.sleep(POLL_S)
        events = agents.gather({m: ("rank_events", ()) for m in machines})
        failed = None
        for m in machines:
            lines, exits = events[m]
            show(lines)
            for rank, code, wall_s in sorted(exits):
                results[rank] = RankExit(by_rank[rank], code, wall_s, False)
                if code != 0 and failed is None:
                    failed = results[rank]
        if failed is not None:
            return failed
    return None


def stop_everywhere(agents, machines: list[str], by_rank: dict[int, Slot], results: dict[int, RankExit],
                    show: Callable[[list[tuple[int, str]]], None]) -> list[str]:
    """Stop every machine's ranks at once and gather what they said last; a rank on a machine that did not answer
    counts as killed. Returns a line per machine that did not answer."""
    outs, errors = agents.gather_all({m: ("stop_ranks", (GRACE_S,)) for m in machines}, timeout=GRACE_S + 60)
    for m in machines:
        lines, exits = outs.get(m, ([], []))
        show(lines)
        for rank, code, wall_s in exits:
            results.setdefault(rank, RankExit(by_rank[rank], code, wall_s, True))
    for rank, slot in by_rank.items():
        results.setdefault(rank, RankExit(slot, 128 + signal.SIGKILL, 0.0, True))
    return errors


def bring_up_cluster(spec, nproc: int, say, cluster: Path):
    """`launch --cluster`'s WAN: built for the launch on the cluster's machines (docs/cluster.md), k, when auto,
    from this machine's headroom; (the emulation, True: this launch built it)."""
    from testbed.cluster import driver
    from testbed.launch.wan import auto_scale
    from testbed.spec.load import load_cluster

    spec_c = load_cluster(cluster)
    k = spec.scale or auto_scale(spec, nproc, say)
    try:
        return driver.up(spec.topology, spec_c, spec.prefix, k, spec.delay), True
    except BaseException:
        driver.shutdown()
        raise

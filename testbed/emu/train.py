"""An emulated training run: the plan's workers on the emulated WAN, one process per (stage,
replica), on a host of the DC the plan assigns. The orchestrator (this module) starts them, holds
a barrier between iterations, collects their intervals into the shared Timeline type, and stops
everything on error, timeout or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field

from testbed.bubbletea.worker_side import KV_DRAIN_S
from testbed.emu import state
from testbed.emu.build import Emulation
from testbed.emu.flowwatch import FlowSampler
from testbed.emu.health import Health, Meter
from testbed.emu.rungroup import run_gid, secure_dir, worker_uid
from testbed.emu.sh import EmuError
from testbed.emu.shaping import MIN_QUEUE_BYTES
from testbed.plan.lower import dry_run, lower
from testbed.plan.plan import Plan
from testbed.program import collective_exchanges, ring_collectives
from testbed.runtime.access import grant, listen_unix, log, peer_cred
from testbed.runtime.config import Endpoint, WorkerConfig
from testbed.runtime.htb import IDLE_PRIO, JUMBO_MTU, class_args, kv_class, trickle_bps
from testbed.runtime.wire import ProtocolError, recv_ctrl, recv_ctrl_skipping, send_ctrl
from testbed.timeline import Interval, Timeline, group_gaps, group_name, sort_intervals

START_TIMEOUT = 90.0  # torch workers import torch and build their stage first
ITERATION_TIMEOUT = 120.0


def sidecar_socket(emu: Emulation, a: str, b: str) -> str:
    return str(state.run_dir(emu.prefix) / f"sidecar-{emu.addr.wan(a, b).ns}.sock")


def worker_configs(plan: Plan, emu: Emulation, compute: str = "modeled", torch_cfg: dict[int, dict] | None = None,
                   conns: dict[tuple[str, str], int] | None = None) -> dict[tuple[int, int], WorkerConfig]:
    """Each group's lowered program and where its peers listen, on the host the program names. `conns`: the
    connections to open per WAN hop when a changing WAN makes later iterations stripe over more (wanchange.py)."""
    if conns:
        plan = dataclasses.replace(plan, links={k: dataclasses.replace(lp, connections=max(lp.connections, conns[k]))
                                                for k, lp in plan.links.items()})
    programs = lower(plan)
    problems = dry_run(programs)
    if problems:
        raise EmuError(f"the plan's programs do not fit together: {problems[0]}")
    hosts = {dc: [h for h in emu.addr.hosts if h.dc == dc] for dc in plan.dcs_used()}
    host = {g: hosts[p.dc][p.host % len(hosts[p.dc])] for g, p in programs.items()}
    where = {g: Endpoint(host[g].ip, p.port) for g, p in programs.items()}
    cfgs = {}
    for g, p in programs.items():
        peers = {q.peer for q in p.pipes} | {x for st in dict.fromkeys(ring_collectives(p.steps))
                                              for ex in collective_exchanges(st, g)
                                              for x in (ex.send_to, ex.recv_from)}
        sidecars = {q.peer: sidecar_socket(emu, *q.wan) for q in p.pipes
                    if q.flow_class is not None and q.wan and plan.links[q.wan].temporal}
        cfgs[(p.stage, p.replica)] = WorkerConfig(
            program=p, ip=host[g].ip, peers={x: where[x] for x in sorted(peers)}, scale=emu.scale, compute=compute,
            dp=plan.dp, host_index=host[g].index, sidecars=sidecars, torch=(torch_cfg or {}).get(p.stage),
            optimizer_s=plan.optimizer_s[p.replica][p.stage] if plan.optimizer_s else 0.0,
            user_timeout_s=emu.user_timeout_s, realtime=emu.realtime,
            clock_offset_s=emu.backend.clock_offset_s(emu.node(host[g].ns)),  # a cluster's own clocks
            predictive=bool(sidecars) and plan.sidecar == "predictive")
    return cfgs


def worker_ns(emu: Emulation, cfg: WorkerConfig) -> str:
    return next(h.ns for h in emu.addr.hosts if h.ip == cfg.ip)


def remove_flow_classes(emu: Emulation, hops: dict) -> None:
    """Best effort (it runs while unwinding errors): tc commands that fail are ignored."""
    from testbed.emu.flowctl import FlowControl

    for link, devs in hops.items():
        for dev, minors in devs.items():
            FlowControl(emu, *link, dev).remove(sorted(set(minors.values())))


def classify_replicas(plan: Plan, emu: Emulation, hops: dict, cfgs: dict[tuple[int, int], WorkerConfig]) -> None:
    """An HTB class per flow class (replica) on each WAN hop a classified pipe crosses, matched by the
    receiving group's port (its data one way, their acknowledgements back, unless the link's ACK class takes
    those first: emu/shaping.py ack_class), recorded in `hops` (so they can be removed even if this fails half-way).
    All start at one priority, where HTB serves them round robin: replicas share a link fairly, as the
    simulator's spatial sharing has it (one FIFO would serve whole windows in arrival order, and this
    kernel has no fair-queueing qdisc); under temporal sharing the sidecar ranks them. They also let
    FlowSampler see each replica's share of the link."""
    from testbed.emu.flowctl import FlowControl

    for cfg in cfgs.values():
        prog = cfg.program
        for q in prog.pipes:
            if q.flow_class is None or not q.wan:
                continue
            a, b = q.wan
            w = emu.addr.wan(a, b)
            link = (w.a, w.b)
            rate = plan.links[(a, b)].capacity_bytes_s * 8 / emu.scale
            r = q.flow_class
            minor = 0x100 + r
            devs = hops.setdefault(link, {})
            for dev, match in ((b, {"ports": (q.port,) * 2}), (a, {"sports": (q.port,) * 2})):
                fc = FlowControl(emu, *link, dev)
                if str(r) not in devs.setdefault(dev, {}):
                    devs[dev][str(r)] = minor
                    fc.add_class(minor, trickle_bps(rate), ceil_bps=rate, prio=IDLE_PRIO, **match)
                else:  # another stage boundary of the same replica on this link: one more filter
                    fc.add_filter(minor, **match)


KV_MINOR = 0xFFF  # BubbleTea's KV caches' HTB class on each WAN hop (replica classes: 0x100 + replica)


def classify_kv(plan: Plan, emu: Emulation, kv_hops: dict, port: int) -> None:
    """BubbleTea's KV caches (TCP to the decode processes' `port`) in a class of their own (KV_MINOR, `kv_class`) on
    both egresses of every WAN link, recorded in `kv_hops` like the replica classes in `hops` (removed the same
    way). Without it they land in the link's default class 1:10, whose guaranteed rate is the whole link: HTB serves
    it before every replica class, so on the emulated Atlas a KV cache went before training, not after. Only the
    caches' bytes (destination `port`) are classed; their ACKs stay in the default class."""
    from testbed.plan.lower import port as worker_port

    top = max((worker_port(plan, s, r) for s in range(plan.pp) for r in range(plan.dp)), default=0)
    if top >= port:
        raise EmuError(f"worker ports reach {top}, the decode port {port}: the KV class would catch training's "
                       "traffic; emulate fewer stages x replicas")
    add_kv_classes(emu, kv_hops, port, {frozenset(k) for k, lp in plan.links.items() if lp.temporal})


def add_kv_classes(emu: Emulation, kv_hops: dict, port: int, temporal: set[frozenset]) -> None:
    """`classify_kv`'s classes and filters, on every WAN link of `emu`, and on every host's shaped NIC into its DC
    (kv_hops[("lan", host namespace)]): most caches go to a decode process in the worker's own DC, and in the
    NIC's one FIFO they held up training's sends and all-reduce (the simulator's transfers inside a DC do not
    contend). There the KV class yields to the default class, which carries training at the NIC's rate."""
    from testbed.emu.flowctl import FlowControl

    for w in emu.addr.wans:
        rate, ceil, prio = kv_class(emu.link_bps(w.a, w.b), frozenset((w.a, w.b)) in temporal)
        devs = kv_hops.setdefault((w.a, w.b), {})
        for dev in (w.a, w.b):
            if "kv" not in devs.setdefault(dev, {}):
                devs[dev]["kv"] = KV_MINOR
                FlowControl(emu, w.a, w.b, dev).add_class(KV_MINOR, rate, ceil_bps=ceil, prio=prio, ports=(port, port))
    for h in emu.addr.hosts:
        lan_bps = emu.lan_rate_bps(h.dc)
        if lan_bps is None or "kv" in kv_hops.get(("lan", h.ns), {}).get("eth0", {}):
            continue  # an unshaped NIC has no queue of its own to share
        kv_hops.setdefault(("lan", h.ns), {})["eth0"] = {"kv": KV_MINOR}
        node, cid = emu.node(h.ns), f"1:{KV_MINOR:x}"
        emu.backend.run(node, ["tc", "class", "add", "dev", "eth0", "parent", "1:1", "classid", cid, "htb",
                               *class_args(*kv_class(lan_bps, True), JUMBO_MTU)])  # behind the default class
        emu.backend.run(node, ["tc", "qdisc", "add", "dev", "eth0", "parent", cid, "bfifo", "limit",
                               str(MIN_QUEUE_BYTES)])
        emu.backend.run(node, ["tc", "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "10",
                               "u32", "match", "ip", "dport", str(port), "0xffff", "flowid", cid])


def remove_kv_classes(emu: Emulation, kv_hops: dict) -> None:
    """Best effort: `add_kv_classes`'s classes and filters, on the WAN links and the hosts' NICs."""
    remove_flow_classes(emu, {link: devs for link, devs in kv_hops.items() if link[0] != "lan"})
    for (kind, ns), _devs in kv_hops.items():
        if kind == "lan":
            node = emu.node(ns)
            emu.backend.run(node, ["tc", "filter", "del", "dev", "eth0", "parent", "1:", "prio", "10"], check=False)
            emu.backend.run(node, ["tc", "class", "del", "dev", "eth0", "classid", f"1:{KV_MINOR:x}"], check=False)


def start_sidecars(plan: Plan, emu: Emulation, hops: dict, procs: list[subprocess.Popen] | None = None
                   ) -> list[subprocess.Popen]:
    """One Atlas sidecar per temporal WAN link whose replica classes `classify_replicas` made, each appended to
    `procs` as it starts (so one that fails leaves those before it to be stopped)."""
    procs = [] if procs is None else procs
    rdir = state.run_dir(emu.prefix)
    for (a, b), devs in hops.items():
        lp = plan.links[(a, b)]
        if not lp.temporal:
            continue  # fair sharing needs no sidecar
        w = emu.addr.wan(a, b)
        cfg = {"devs": devs, "turn_order": plan.turn_order, "turn_policy": plan.turn_policy,
               "socket": sidecar_socket(emu, a, b),
               # ranks each transfer as its worker announces it, from the plan's schedule (runtime/announce.py)
               "predictive": plan.sidecar == "predictive",
               "drain_s": 0.0,  # the receiver sends the end, once the tail has crossed (sidecar.py)
               # the delay line delays a link's packets before its HTB shapes them: notices wait one latency, as
               # the data does before it reaches the shaper (runtime/sidecar.py); netem delays inside the class
               "notice_delay_s": lp.latency_s if emu.delay == "nfqueue" else 0.0,
               "link_bps": lp.capacity_bytes_s * 8 / emu.scale,  # emulated bits/s, as HTB takes them
               "min_rate_bps": trickle_bps(lp.capacity_bytes_s * 8 / emu.scale),
               "mtu": emu.mtu(a, b),  # the link's packet size (its HTB quantum), whatever its rate later
               "gid": run_gid(emu.backend), "peer_uids": [worker_uid(emu.backend)], "realtime": emu.realtime}
        remote = emu.backend.start_sidecar(emu.node(w.ns), cfg)  # a cluster: on the machines holding its devices
        if remote is not None:
            procs.extend(remote)
            continue
        path = rdir / f"sidecar-{w.ns}.json"
        path.write_text(json.dumps(cfg))
        log = open(rdir / f"sidecar-{w.ns}.log", "w")  # noqa: SIM115 (owned by the child)
        p = emu.backend.spawn(emu.node(w.ns), "testbed.runtime.sidecar", [str(path)],
                              stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        procs.append(p)
        if p.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            raise EmuError(f"the Atlas sidecar for {a}-{b} did not start")
        grant(cfg["socket"], cfg["gid"])  # a sidecar in a container may not set its socket's group itself
    return procs


def started(p: subprocess.Popen, pid: int) -> bool:
    """Whether host PID `pid` is what `p` runs: `p` itself (`ip netns exec` and `mnexec` exec in place), or for
    a `docker exec` client the process it started inside the container."""
    from testbed.emu.containers import ContainerProcess

    return p.owns(pid) if isinstance(p, ContainerProcess) else pid == p.pid


class Controller:
    """The control socket: one connection per worker, length-prefixed JSON, with timeouts. Mode 0660 in the
    run's group; a connection is accepted only from a worker process this run started (SO_PEERCRED's pid),
    running as the run's worker user, and saying hello as that worker; anyone else is refused and logged."""

    def __init__(self, path: str, n: int, gid: int | None = None, worker_uid: int = 0) -> None:
        self.path, self.n, self.worker_uid = path, n, worker_uid
        self.srv = listen_unix(path, gid, backlog=max(n, 8))
        self.conns: dict[tuple[int, int], socket.socket] = {}
        self.refused: list[str] = []
        self.rejected: list[str] = []  # malformed messages from our workers, skipped
        self.watch = lambda: None  # raises EmuError when a part of the run the workers need has died
        # connections another machine's agent relayed (testbed/cluster/relay.py), with the worker it vouched for
        self.vouched: queue.Queue[tuple[socket.socket, str, int]] = queue.Queue()

    def vouch(self, c: socket.socket, machine: str, pid: int) -> None:
        self.vouched.put((c, machine, pid))

    def _refuse(self, c: socket.socket, why: str) -> None:
        pid, uid, gid = peer_cred(c)
        line = f"control socket {self.path}: refused pid {pid} (uid {uid}, gid {gid}): {why}"
        self.refused.append(line)
        log(line)
        c.close()

    def _worker_of(self, c: socket.socket, procs: dict[tuple[int, int], subprocess.Popen]) -> tuple | str:
        """The (stage, replica) whose process is at the other end of `c`, or why it is no worker of ours."""
        pid, uid, _ = peer_cred(c)
        for key, p in procs.items():
            if started(p, pid):
                if uid != self.worker_uid:
                    return f"worker s{key[0]}r{key[1]}'s pid, but uid {uid} (workers run as {self.worker_uid})"
                return key
        return "not a process this run started"

    def _next(self, procs: dict[tuple[int, int], subprocess.Popen]) -> tuple[socket.socket | None, tuple | str]:
        """The next connection and whose it is: one an agent vouched for, else one on our socket (None: none yet)."""
        try:
            c, machine, pid = self.vouched.get_nowait()
        except queue.Empty:
            try:
                c, _ = self.srv.accept()
            except TimeoutError:
                return None, ""
            return c, self._worker_of(c, procs)
        for key, p in procs.items():
            if getattr(p, "machine", None) == machine and p.pid == pid:
                return c, key
        return c, f"not a process this run started on machine {machine} (pid {pid})"

    def accept_all(self, procs: dict[tuple[int, int], subprocess.Popen], timeout: float) -> None:
        self.srv.settimeout(0.2)
        deadline = time.monotonic() + timeout
        while len(self.conns) < self.n:
            _check(list(procs.values()))
            if time.monotonic() > deadline:
                raise EmuError(f"only {len(self.conns)} of {self.n} workers registered within {timeout:g} s")
            c, who = self._next(procs)
            if c is None:
                continue
            if isinstance(who, str):
                self._refuse(c, who)
                continue
            c.settimeout(timeout)
            try:
                hello = tuple(recv_ctrl(c)["hello"])
            except (OSError, ProtocolError, KeyError, TypeError) as e:
                self._refuse(c, f"worker s{who[0]}r{who[1]} sent no hello ({e})")
                continue
            if hello != who or who in self.conns:
                self._refuse(c, f"worker s{who[0]}r{who[1]} said hello as {list(hello)}")
                continue
            self.conns[who] = c

    def expect(self, key: str, procs: list[subprocess.Popen], timeout: float) -> dict[tuple[int, int], dict]:
        """One message with `key` from every worker; a dead worker or a timeout aborts."""
        out: dict[tuple[int, int], dict] = {}
        errors: list[str] = []

        def read(k, c) -> None:
            deadline = time.monotonic() + timeout
            try:
                while True:  # a malformed message is rejected (and logged); the worker's next one counts
                    c.settimeout(max(0.01, deadline - time.monotonic()))
                    msg = recv_ctrl_skipping(c, lambda why: self._reject(k, why))
                    why = bad_message(key, msg)
                    if not why:
                        out[k] = msg
                        return
                    self._reject(k, why)
            except TimeoutError:
                errors.append(f"worker s{k[0]}r{k[1]}: no {key!r} within {timeout:g} s")
            except (OSError, ProtocolError) as e:
                errors.append(f"worker s{k[0]}r{k[1]}: {e or type(e).__name__}")

        threads = [threading.Thread(target=read, args=(k, c), daemon=True) for k, c in self.conns.items()]
        for t in threads:
            t.start()
        while alive := [t for t in threads if t.is_alive()]:  # a dead worker ends the run now, not at the timeout
            alive[0].join(0.25)
            _check(procs)
            self.watch()
            if errors:
                _check_soon(procs)
                raise EmuError(f"waiting for {key}: {errors[0]}")
        if errors:
            _check_soon(procs)
            raise EmuError(f"waiting for {key}: {errors[0]}")
        return out

    def _reject(self, who: tuple[int, int], why: str) -> None:
        line = f"control socket {self.path}: rejected a message from worker s{who[0]}r{who[1]}: {why}"
        self.rejected.append(line)
        log(line)

    def broadcast(self, msg: dict, procs: list[subprocess.Popen] | None = None) -> None:
        for (s, r), c in self.conns.items():
            self.send((s, r), c, msg, procs)

    @staticmethod
    def send(who: tuple[int, int], c: socket.socket, msg: dict, procs: list[subprocess.Popen] | None = None) -> None:
        """One message to a worker; a worker that died meanwhile is an EmuError naming it (not a BrokenPipeError,
        which the CLI's framework would turn into a silent exit)."""
        try:
            send_ctrl(c, msg)
        except OSError as e:
            if procs:
                time.sleep(0.1)  # its exit status is a better message than the pipe's
                _check(procs)
            raise EmuError(f"worker s{who[0]}r{who[1]} is gone ({e.strerror or e})") from None

    def close(self) -> None:
        for c in self.conns.values():
            c.close()
        self.srv.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def bad_message(key: str, msg: dict) -> str:
    """Why a worker's message is not the `key` message the orchestrator waits for ("" if it is): the key, and for
    `done` its log of [kind, microbatch, t0, t1, bytes] rows and its waits."""
    if key not in msg:
        return f"expected {key!r}, got {sorted(msg)[:5]}"
    if key != "done":
        return ""
    log = msg.get("log")
    num = (int, float)
    if not isinstance(log, list) or not all(
            isinstance(r, list) and len(r) == 5 and isinstance(r[0], str) and isinstance(r[1], int)
            and all(isinstance(x, num) and not isinstance(x, bool) for x in r[2:]) for r in log):
        return "its log is not a list of [kind, microbatch, t0, t1, bytes]"
    for name in ("waits", "wakes"):
        w = msg.get(name, [0, 0.0, 0.0, 0.0])
        if not isinstance(w, list) or len(w) != 4 or not all(isinstance(x, num) for x in w):
            return f"its {name} are not [count, late, worst, signed]"
    if not isinstance(msg.get("degraded", ""), str):
        return "its degraded is not text"
    if msg.get("cpu_class", "nice") not in ("realtime", "nice"):
        return "its cpu_class is not realtime or nice"
    loss = msg.get("loss")
    if loss is not None and (not isinstance(loss, num) or isinstance(loss, bool)):
        return "its loss is not a number"
    return ""


def check_delaylines(emu: Emulation) -> None:
    """A delay line that exited stopped its WAN link (it has no fail-open: emu/delayline.py): end the run with one
    line naming it, not at the iteration timeout."""
    for ns, p in emu.delaylines.items():
        code = p.poll()
        if code is not None:
            how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
            raise EmuError(f"the delay line of WAN link {ns} died ({how}): the link stopped (its log: "
                           f"{state.run_dir(emu.prefix) / (ns + '.delay.log')})")


def _check_soon(procs: list[subprocess.Popen], wait_s: float = 1.0) -> None:
    """A worker's control connection closed: its exit status and last words, once it has exited, say why better
    than the closed connection does (it closes as the process exits, before the exit can be reaped)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.02)
    _check(procs)


LOST_PEER = "peer closed the connection"  # what a worker says when another one ended first


def _check(procs: list[subprocess.Popen]) -> None:
    """A worker that exited with an error ends the run with its last words; of several, one that did not merely
    lose a peer (the peer that ended first says why)."""
    dead = []
    for p in procs:
        if p.poll() is not None and p.returncode != 0:
            err = p.stderr.read().strip().splitlines() if p.stderr else []
            why = err[-1] if err else f"killed by signal {-p.returncode}" if p.returncode < 0 else "no message"
            dead.append((LOST_PEER in why, p.returncode, why))
    if dead:
        _, code, why = min(dead, key=lambda d: d[0])
        raise EmuError(f"a worker exited with status {code}: {why}")


def torch_config(plan: Plan, exp_model, lr: float) -> dict[int, dict]:
    """Per stage: the real model's shape for `compute: torch`."""
    from testbed.costs.stage import split_layers

    m = exp_model
    layers = plan.layers or split_layers(m.layers, plan.pp)  # the plan's split (balanced by GPU speed)
    return {s: {"layers": n, "hidden": m.hidden, "heads": m.heads, "vocab": m.vocab, "seq": m.seq_len,
                "micro": plan.microbatch_size, "lr": lr} for s, n in enumerate(layers)}


def start_bubbletea(emu: Emulation, service: dict) -> tuple[subprocess.Popen, str, str]:
    """The BubbleTea service (testbed/bubbletea/service.py) with its configuration."""
    rdir = state.run_dir(emu.prefix) / "bubbletea"  # the service's own directory: it may run unprivileged
    rdir.mkdir(exist_ok=True)
    gid, uid = run_gid(emu.backend), worker_uid(emu.backend)
    secure_dir(rdir, gid, uid)
    sock, results = str(rdir / "bubbletea.sock"), str(rdir / "bubbletea-results.json")
    path = rdir / "bubbletea.json"
    path.write_text(json.dumps({**service, "socket": sock, "results": results, "gid": gid, "peer_uids": [uid]}))
    log = open(rdir / "bubbletea.log", "w")  # noqa: SIM115 (owned by the child)
    p = emu.backend.spawn(None, "testbed.bubbletea.service", [str(path)],
                          stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    if p.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
        raise EmuError("the BubbleTea service did not start")
    grant(sock, gid)
    return p, sock, results


def start_decoders(plan: Plan, emu: Emulation, sock: str, model: str, steps: int, compute: str = "torch",
                   procs: list[subprocess.Popen] | None = None) -> tuple[list[subprocess.Popen], dict[str, Endpoint]]:
    """One decode process per DC (testbed/bubbletea/decode.py) on the DC's first host: KV caches cross the
    emulated WAN to it (modeled compute: it receives them and decodes nothing). Returns the processes (appended
    to `procs` as they start) and each DC's address."""
    from testbed.bubbletea.emulated import DECODE_PORT

    rdir = state.run_dir(emu.prefix)
    procs, where = [] if procs is None else procs, {}
    for dc in plan.dcs_used():
        h = next(h for h in emu.addr.hosts if h.dc == dc)
        path = rdir / f"decode-{dc}.json"
        path.write_text(json.dumps({"ip": h.ip, "port": DECODE_PORT, "service": sock, "model": model,
                                    "decode_tokens": steps, "dc": dc, "compute": compute}))
        log = open(rdir / f"decode-{dc}.log", "w")  # noqa: SIM115 (owned by the child)
        p = emu.backend.spawn(emu.node(h.ns), "testbed.bubbletea.decode", [str(path)], stdout=subprocess.PIPE,
                              stderr=log, text=True, start_new_session=True)
        procs.append(p)
        if p.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            raise EmuError(f"the decode process in {dc} did not start")
        where[dc] = Endpoint(h.ip, DECODE_PORT)
    return procs, where


@dataclass
class TrainingRun:
    """What one emulated run produced besides its timeline."""

    timeline: Timeline
    degraded: str = ""  # why the run did not run as planned (a lost sidecar or BubbleTea service)
    losses: list[float] = field(default_factory=list)  # per iteration, torch compute only
    bubbletea: dict = field(default_factory=dict)  # what the BubbleTea service recorded (its results file)
    flows: list[tuple] = field(default_factory=list)  # (iteration, t_s on the timeline, link, towards, replica, bytes)
    captured: list[tuple] = field(default_factory=list)  # flows.csv rows of a packet capture (run's timeline clock)
    capture_summary: str = ""
    starts: list[float] = field(default_factory=list)  # each iteration's monotonic start
    health: Health = field(default_factory=Health)  # the run's timing health (testbed/emu/health.py)


def capture_rows(plan: Plan, emu: Emulation, cfgs: dict, res, starts: list[float], durations: list[float]
                 ) -> list[tuple]:
    """flows.csv rows of a training run's capture, on the run's timeline clock (each iteration's bins
    shifted as its intervals are; bins in the barrier gaps between iterations are left out). A flow
    is labelled by the worker port at either end: replica r, worker s<stage>r<replica>."""
    from testbed.analysis.flows import Endpoint, flow_rows

    ends = {(c.ip, c.program.port): Endpoint(plan.stage_dc[r][s], str(r), group_name(s, r))
            for (s, r), c in cfgs.items()}
    dc_of = {h.ip: Endpoint(h.dc) for h in emu.addr.hosts}
    shifted = []
    for key, b, nbytes, pkts in res.rows:
        t = b * 1e-3
        for k, (t0, d) in enumerate(zip(starts, durations, strict=True)):
            if t0 <= t < t0 + d:
                shifted.append((key, b + round((sum(durations[:k]) - t0) * 1e3), nbytes, pkts))
                break
    return flow_rows(plan.run_id, shifted, lambda ip, port: ends.get((ip, port)) or dc_of.get(ip, Endpoint()), 0)


def stop_processes(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """Terminate each process, give it `grace_s`, then kill it: best effort while a run unwinds."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def kill_processes(procs: list[subprocess.Popen]) -> None:
    """Kill every process still running (the workers, once the run is over or has failed)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def control_socket(stack: contextlib.ExitStack, emu: Emulation, n: int) -> Controller:
    """The run's control socket for `n` workers, closed when the run ends."""
    ctl = Controller(str(state.run_dir(emu.prefix) / "ctl.sock"), n, run_gid(emu.backend), worker_uid(emu.backend))
    ctl.watch = lambda: check_delaylines(emu)
    stack.callback(ctl.close)
    relay = emu.backend.control_relay(ctl)  # other machines' workers reach ctl through their agents (a cluster)
    stack.callback(relay.close)
    return ctl


def shape_replicas(stack: contextlib.ExitStack, plan: Plan, emu: Emulation, cfgs: dict) -> dict:
    """A class per replica on every WAN hop (fair sharing, or turns where a sidecar ranks them) and the sidecars;
    returns the hops' classes (link -> dev -> replica -> class minor). Removed and stopped when the run ends."""
    hops: dict[tuple[str, str], dict[str, dict[str, int]]] = {}
    stack.callback(remove_flow_classes, emu, hops)
    if any(q.flow_class is not None for c in cfgs.values() for q in c.program.pipes):
        classify_replicas(plan, emu, hops, cfgs)
        sidecars: list[subprocess.Popen] = []
        stack.callback(stop_processes, sidecars)
        start_sidecars(plan, emu, hops, sidecars)
    return hops


@dataclass
class Serving:
    """BubbleTea's side of a run: the KV caches' classes, the service's results file, whether decoders run."""

    kv_hops: dict = field(default_factory=dict)  # link -> dev -> "kv" -> KV_MINOR
    results: str | None = None
    decoders: bool = False


def serve_bubbletea(stack: contextlib.ExitStack, plan: Plan, emu: Emulation, bubbletea: dict | None, compute: str,
                    cfgs: dict) -> tuple[dict, Serving]:
    """With `bubbletea`: the KV caches' classes, the service and the decode processes, stopped and removed when the
    run ends; returns the workers' configurations with the service's address, and what it serves."""
    serving = Serving()
    if bubbletea is None:
        return cfgs, serving
    from testbed.bubbletea.emulated import DECODE_PORT
    from testbed.bubbletea.kvdelay import start_kv_delaylines, stop_kv_delaylines
    from testbed.runtime.config import PrefillConfig

    stack.callback(remove_kv_classes, emu, serving.kv_hops)
    classify_kv(plan, emu, serving.kv_hops, DECODE_PORT)
    kv_lines: list[str] = []  # WAN nodes whose KV caches have a delay line of their own (testbed/bubbletea/kvdelay.py)
    stack.callback(lambda: kv_lines and stop_kv_delaylines(emu, DECODE_PORT, kv_lines))
    procs: list[subprocess.Popen] = []
    stack.callback(stop_processes, procs)
    service, sock, serving.results = start_bubbletea(emu, bubbletea)
    procs.append(service)
    where: dict[str, Endpoint] = {}
    ship = bubbletea.get("ship_kv", True) and compute == "modeled"
    if compute == "torch" or ship:
        kv_lines += start_kv_delaylines(emu, DECODE_PORT)
        _, where = start_decoders(plan, emu, sock, bubbletea["model"], bubbletea["decode_tokens"], compute, procs)
        serving.decoders = True
    # modeled compute ships filler of the modeled KV cache's size over the emulation's scale, on as many
    # connections as a WAN pipe opens (the simulator's KV flow has their cap)
    kv_tok = bubbletea["kv_bytes_per_token"] / emu.scale if ship else 0.0
    kv_conns = max((lp.connections for lp in plan.links.values()), default=1)
    pf = PrefillConfig(bubbletea["model"], bubbletea["layers"], where, kv_tok, kv_conns)
    return {k: dataclasses.replace(c, bubbletea=sock, prefill=pf) for k, c in cfgs.items()}, serving


def start_workers(stack: contextlib.ExitStack, emu: Emulation, cfgs: dict, ctl: Controller
                  ) -> tuple[list[subprocess.Popen], dict[tuple[int, int], subprocess.Popen]]:
    """One worker process per group on its host, killed if still running when the run ends; returns once every
    worker has connected to the control socket and said it is ready."""
    rdir = state.run_dir(emu.prefix)
    procs: list[subprocess.Popen] = []
    workers: dict[tuple[int, int], subprocess.Popen] = {}
    stack.callback(kill_processes, procs)
    for (s, r), cfg in cfgs.items():
        path = rdir / f"worker-s{s}r{r}.json"
        path.write_text(cfg.to_json())
        node = emu.node(worker_ns(emu, cfg))
        procs.append(emu.backend.spawn(node, "testbed.runtime.worker", [str(path), ctl.path],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                       start_new_session=True))
        workers[(s, r)] = procs[-1]
    ctl.accept_all(workers, START_TIMEOUT)
    ctl.expect("ready", procs, START_TIMEOUT)
    return procs, workers


def connect_live(live, plan: Plan, emu: Emulation, hops: dict, kv_hops: dict) -> None:
    """Tell a changing WAN (wanchange.LiveWan) the run's sidecars and classes, then set every link to its state at
    time 0."""
    live.sidecar_paths.update({frozenset(link): sidecar_socket(emu, *link) for link in hops
                               if plan.links[link].temporal})
    temporal = {frozenset(k) for k, lp in plan.links.items() if lp.temporal}
    live.fair_classes.update({frozenset(link): {dev: tuple(ms.values()) for dev, ms in devs.items()}
                              for link, devs in hops.items() if not plan.links[link].temporal})
    wan_kv = [(k, v) for k, v in kv_hops.items() if k[0] != "lan"]
    for link, devs in wan_kv:  # re-rated as made
        live.kv_classes[frozenset(link)] = {dev: (*ms.values(), frozenset(link) in temporal)
                                            for dev, ms in devs.items()}
    for link, devs in (*hops.items(), *wan_kv):
        have = live.leaves.setdefault(frozenset(link), {})
        for dev, ms in devs.items():
            have[dev] = tuple(sorted({*have.get(dev, ()), *ms.values()}))
    live.prepare()


@dataclass
class Iterations:
    """What the workers reported, iteration after iteration."""

    intervals: list[Interval] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)  # each iteration's monotonic start
    degraded: str = ""


def to_machine(t_s: float, offset_s: float) -> float:
    """A time of this process's clock on the clock of a machine `offset_s` ahead (a go sent to a worker there)."""
    return t_s + offset_s


def in_our_clock(log: list[list], offset_s: float) -> list[list]:
    """A worker's [kind, microbatch, t0, t1, bytes] rows, measured on a machine `offset_s` ahead, on this process's
    clock (the same list when the clock is shared: testbed/cluster/clock.py)."""
    if offset_s == 0.0:
        return log
    return [[k, mb, t0 - offset_s, t1 - offset_s, b] for k, mb, t0, t1, b in log]


def go(ctl: Controller, procs: list[subprocess.Popen], it: int, t_start: float, replan, clock_s: float,
       offsets: dict[tuple[int, int], float] | None = None) -> None:
    """Start iteration `it` at `t_start` (each worker's on its machine's clock: `offsets`, a cluster's own clocks);
    with `replan`, each worker gets the iteration's program with its go."""
    offsets = offsets or {}
    programs = lower(replan(clock_s)) if replan is not None else None
    for (s, r), c in ctl.conns.items():
        msg = {"go": it, "t": to_machine(t_start, offsets.get((s, r), 0.0))}
        if programs is not None:
            msg["program"] = json.loads(programs[group_name(s, r)].to_json())
        ctl.send((s, r), c, msg, procs)


def iterate(plan: Plan, emu: Emulation, cfgs: dict, ctl: Controller, procs: list[subprocess.Popen], iterations: int,
            sampler: FlowSampler, meter: Meter, live=None, replan=None, progress=None) -> Iterations:
    """Every iteration: its go, the workers' done (HTB counters sampled over one steady iteration), their intervals
    on the run's clock (barrier gaps removed), their waits for the timing health."""
    out = Iterations()
    host_of = {key: worker_ns(emu, c) for key, c in cfgs.items()}
    offsets = {key: c.clock_offset_s for key, c in cfgs.items()}  # a cluster's own clocks (testbed/cluster/clock.py)
    steady = min(1, iterations - 1)  # the first steady iteration, as the summary's
    for it in range(iterations):
        t_start = time.monotonic() + 0.05
        out.starts.append(t_start)
        if live is not None:
            live.begin(it, t_start, sum(out.durations))
        go(ctl, procs, it, t_start, replan, sum(out.durations), offsets)
        with sampler if it == steady else contextlib.nullcontext():
            done = ctl.expect("done", procs, ITERATION_TIMEOUT)
        for key, d in done.items():  # every time below on this process's clock
            d["log"] = in_our_clock(d["log"], offsets.get(key, 0.0))
        if live is not None:
            live.end()
        end = max((iv[3] for d in done.values() for iv in d["log"]), default=t_start)  # prefill included
        out.degraded = out.degraded or next((d["degraded"] for d in done.values() if d.get("degraded")), "")
        if it >= steady:
            for key, d in done.items():
                meter.add_waits(host_of[key], d.get("waits"), d.get("wakes"))
                meter.add_cpu_class(f"worker {key[0]}.{key[1]}", d.get("cpu_class"))
        it_losses = [d["loss"] for d in done.values() if d.get("loss") is not None]
        if it_losses:
            out.losses.append(sum(it_losses) / len(it_losses))
        shift = sum(out.durations) - t_start
        for (s, r), msg in done.items():
            dc = plan.stage_dc[r][s]
            for kind, mb, t0, t1, nbytes in msg["log"]:
                out.intervals.append(Interval(it, group_name(s, r), dc, s, r, kind, mb, t0 + shift, t1 + shift,
                                              nbytes))
        out.durations.append(end - t_start)
        if progress:
            progress()
    return out


def stop_workers(ctl: Controller, procs: list[subprocess.Popen], decoders: bool) -> None:
    """The run is over: the last KV caches reach their decode processes, then every worker is told to stop (it
    waits up to KV_DRAIN_S for its KV caches still in flight) and given time to exit."""
    if decoders:
        time.sleep(1.0)
    ctl.broadcast({"stop": True})
    for p in procs:
        try:
            p.wait(10 + KV_DRAIN_S)
        except subprocess.TimeoutExpired:
            p.kill()


def run_training(plan: Plan, emu: Emulation, iterations: int, progress=None, compute: str = "modeled",
                 torch_cfg: dict[int, dict] | None = None, bubbletea: dict | None = None,
                 capture: bool = False, live=None, replan=None, conns: dict | None = None) -> TrainingRun:
    """Run `iterations` iterations of `plan` on `emu`; return the emulated timeline (barrier gaps removed).
    `bubbletea`: the BubbleTea service's configuration (testbed/bubbletea/emulated.py), to serve prefill.
    `capture`: packet headers on every WAN link for the whole run (testbed/emu/capture.py) instead of the
    HTB class counters of one iteration. On a changing WAN, `live` (wanchange.LiveWan) applies the link
    schedule, `replan(clock)` gives each iteration's plan (its programs go out with the iteration's go) and
    `conns` the connections to open per WAN hop. Each resource the run starts (control socket, flow classes,
    sidecars, BubbleTea's service and decoders, workers, capture, meter) goes on one stack and is stopped or
    removed in reverse order whatever ends the run (an error, a timeout, Ctrl-C)."""
    if plan.net is not None and plan.net.scale is not None and plan.net.scale != emu.scale:
        raise EmuError(f"the plan models the network at k={plan.net.scale:g}, this one runs at k={emu.scale:g}: "
                       "build the plan on it (build_plan(..., built=emu.net))")
    cfgs = worker_configs(plan, emu, compute, torch_cfg, conns)
    cap = None
    with contextlib.ExitStack() as stack:
        ctl = control_socket(stack, emu, len(cfgs))
        hops = shape_replicas(stack, plan, emu, cfgs)
        cfgs, serving = serve_bubbletea(stack, plan, emu, bubbletea, compute, cfgs)
        procs, _ = start_workers(stack, emu, cfgs, ctl)
        sampler = FlowSampler(emu, {} if capture else hops)
        if capture:
            from testbed.emu.capture import Capture

            cap = stack.enter_context(Capture(emu, seconds=ITERATION_TIMEOUT * iterations))
        if live is not None:
            connect_live(live, plan, emu, hops, serving.kv_hops)
        meter = Meter(emu)
        stack.callback(meter.abort)  # its sampling thread ends with the run, whatever ended it
        meter.start()
        its = iterate(plan, emu, cfgs, ctl, procs, iterations, sampler, meter, live, replan, progress)
        health = meter.stop()
        stop_workers(ctl, procs, serving.decoders)
    return training_run(plan, emu, cfgs, its, health, serving, cap.result if cap is not None else None,
                        sampler, iterations)


def training_run(plan: Plan, emu: Emulation, cfgs: dict, its: Iterations, health: Health, serving: Serving,
                 cap_res, sampler: FlowSampler, iterations: int) -> TrainingRun:
    """The run's result from what the workers, the service, the capture and the HTB counters recorded."""
    bt_results: dict = {}
    if serving.results and os.path.exists(serving.results):
        with open(serving.results) as f:
            bt_results = json.load(f)
    durations, starts = its.durations, its.starts
    ivs = its.intervals + group_gaps(its.intervals, durations)
    run = TrainingRun(Timeline(plan.run_id, "emu", sort_intervals(ivs), durations, plan.pp * plan.dp), its.degraded,
                      its.losses, bt_results, starts=starts, health=health)
    if cap_res is not None:
        run.captured, run.capture_summary = capture_rows(plan, emu, cfgs, cap_res, starts, durations), cap_res.summary()
    k = min(1, iterations - 1)
    for t, link, dev, r, sent in sampler.samples:
        if t >= starts[k]:
            run.flows.append((k, t - starts[k] + sum(durations[:k]), link, dev, r, sent))
    return run

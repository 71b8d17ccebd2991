"""Timing health of an emulated run: how far the machine kept the emulation's timing, measured over the run,
and the iteration-time error that can follow from it (the run's timing error, against its budget).

Measured (docs/reliability.md): how late the workers' timed waits end against what they asked (each worker
reports them with its iterations), how late the delay lines release packets against their due time (their
stats files), CPU steal and CPU pressure (/proc/stat, /proc/pressure/cpu), the run queue (/proc/stat
`procs_running`, sampled), packets the WAN shaping dropped (`tc -s qdisc` in each WAN namespace), and the CPU
time BubbleTea's own processes took (its service, decode processes, KV delay lines and KV senders: the emulation's
work that a deployment does on other hardware, on the cores that also run the workers).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field

DEFAULT_BUDGET = 0.04  # the iteration-time error a run may carry from timing before it is marked degraded: the
# bound runs below the error it explains on a busy machine (docs/reliability.md, "Results under load")
RUNQ_PERIOD_S = 0.1
POKE_WAIT_S = 0.3  # a poked delay line writes its stats file within a loop turn (0.2 s at most when idle)


@dataclass
class WaitTotals:
    """Timed waits of modeled compute, summed (testbed/runtime/worker.py WaitStats)."""

    n: int = 0
    late_sum_s: float = 0.0
    late_max_s: float = 0.0
    err_sum_s: float = 0.0

    def add(self, waits: list[float]) -> None:
        n, late, worst, err = waits
        self.n += int(n)
        self.late_sum_s += late
        self.late_max_s = max(self.late_max_s, worst)
        self.err_sum_s += err

    @property
    def late_mean_s(self) -> float:
        return self.late_sum_s / self.n if self.n else 0.0


@dataclass
class Health:
    """One run's timing health: per host (worker waits), per WAN link (delay-line lag, drops), the machine."""

    waits: dict[str, WaitTotals] = field(default_factory=dict)  # emulated host -> its workers' waits
    wakes: WaitTotals = field(default_factory=WaitTotals)  # threads resuming for a message (sent or in), all hosts
    lag_mean_s: dict[str, float] = field(default_factory=dict)  # WAN link -> mean (release - due) over the run
    lag_max_s: dict[str, float] = field(default_factory=dict)  # WAN link -> worst lateness since the line started
    rtt_s: dict[str, float] = field(default_factory=dict)  # WAN link -> its round trip (configured)
    drops: dict[str, int] = field(default_factory=dict)  # WAN link -> packets its qdiscs dropped during the run
    steal_share: float = 0.0
    pressure_share: float | None = None  # share of the run some task waited for a CPU (None: no PSI here)
    runq_mean: float = 0.0  # runnable tasks per CPU, mean of the samples
    runq_max: float = 0.0
    bubbletea_cpu_share: float | None = None  # share of the machine's CPU time BubbleTea's processes took (None: none)
    cpu_class: dict[str, str] = field(default_factory=dict)  # worker or delay line -> realtime | nice (cpuclass.py)

    def all_waits(self) -> WaitTotals:
        out = WaitTotals()
        for w in self.waits.values():
            out.add([w.n, w.late_sum_s, w.late_max_s, w.err_sum_s])
        return out


@dataclass(frozen=True)
class Budget:
    """The iteration-time error the measured timing can cause, by source (shares of the iteration)."""

    waits: float
    delay: float
    steal: float
    wakes: float = 0.0
    fabric: float = 0.0  # transfers inside a DC slower than the fabric's shaped rate (testbed/emu/fabric.py)

    @property
    def total(self) -> float:
        return self.waits + self.delay + self.steal + self.wakes + self.fabric


def critical_steps(pp: int, microbatches: int, wan_boundaries: int, optimizer: bool = True) -> tuple[int, int]:
    """(timed waits, WAN crossings) on an iteration's critical path, at most: a pipeline's longest chain runs the
    bottleneck stage's forward and backward of every microbatch plus the fill and drain through the other stages,
    2 (m + pp - 1) compute steps (and the optimizer step); its transfers are every microbatch's on the bottleneck
    boundary plus one per other WAN boundary, each way: 2 (m + h - 1) for h WAN boundaries."""
    waits = 2 * (microbatches + pp - 1) + (1 if optimizer else 0)
    crossings = 2 * (microbatches + wan_boundaries - 1) if wan_boundaries else 0
    return waits, crossings


@dataclass(frozen=True)
class PathLink:
    """A WAN link the plan's traffic crosses, as the budget needs it: one transfer's time alone on it (real-world,
    which the emulation keeps), and whether its connections' windows bound that transfer (n W / RTT < C)."""

    transfer_s: float
    window_bound: bool


def budget(h: Health, iteration_s: float, waits_on_path: int, crossings_on_path: int,
           links: dict[str, PathLink] | None = None) -> Budget:
    """The error the run's timing can cause in its iteration time (docs/reliability.md):
    - waits: every timed wait on the critical path ends late by the mean lateness measured;
    - delay: every WAN crossing on it is released late by the link's mean lag (early releases count against late
      ones: the mean is what lengthens a round trip, its spread averages out), and on a window-bound link a
      transfer waits one round trip per window, whose two releases each carry that lag: 2 lag / RTT of its
      transfer time, for as much of the iteration as the crossings' transfers fill; the worst of `links` (those
      the plan's traffic crosses; None: every link, each counted as latency-bound);
    - steal: the share of the machine's time its hypervisor took stretches every step alike;
    - wakes: every crossing on the path wakes a thread at each end, the sender's (idle until the message) and the
      receiver's (waiting for it), each late by the mean measured."""
    if iteration_s <= 0:
        return Budget(0.0, 0.0, h.steal_share)
    w = waits_on_path * h.all_waits().late_mean_s / iteration_s
    d = 0.0
    for name, signed in h.lag_mean_s.items():
        if links is not None and name not in links:
            continue
        lag, link = abs(signed), (links or {}).get(name)
        share = crossings_on_path * lag / iteration_s
        rtt = h.rtt_s.get(name, 0.0)
        if link is not None and link.window_bound and rtt > 0:
            share += 2 * lag / rtt * min(1.0, crossings_on_path * link.transfer_s / iteration_s)
        d = max(d, share)
    return Budget(w, d, h.steal_share, 2 * crossings_on_path * h.wakes.late_mean_s / iteration_s)


def verdict(h: Health, b: Budget, limit: float = DEFAULT_BUDGET) -> str:
    """Why the run should not be trusted ("" if it may): its timing error over `limit`, or packets dropped by the
    shaping (the simulator loses none)."""
    why = []
    if b.total > limit:
        parts = {"late waits": b.waits, "delay-line lag": b.delay, "CPU steal": b.steal, "late wake-ups": b.wakes,
                 "a slow DC fabric": b.fabric}
        top = max(parts, key=lambda k: parts[k])
        bt = h.bubbletea_cpu_share
        also = (f"; BubbleTea's own processes took {bt:.0%} of the CPUs: KV shipping, bubbletea.ship_kv"
                if bt is not None and bt > limit else "")
        why.append(f"timing error up to {b.total:.1%} > budget {limit:.1%} (most from {top}{also})")
    dropped = sum(h.drops.values())
    if dropped:
        worst = max(h.drops, key=lambda k: h.drops[k])
        why.append(f"the WAN shaping dropped {dropped} packets (most on {worst})")
    return "; ".join(why)


def summary_fields(h: Health, b: Budget | None) -> dict[str, object]:
    """summary.csv's timing-health columns (testbed/columns.py)."""
    worst_host = max(h.waits.values(), key=lambda w: w.late_mean_s, default=WaitTotals())
    allw = h.all_waits()
    return {
        "wait_late_ms": round(allw.late_mean_s * 1e3, 4),
        "wait_late_host_ms": round(worst_host.late_mean_s * 1e3, 4),
        "wait_late_max_ms": round(allw.late_max_s * 1e3, 4),
        "wake_late_ms": round(h.wakes.late_mean_s * 1e3, 4),
        "delay_lag_ms": round(max(h.lag_mean_s.values(), key=abs, default=0.0) * 1e3, 4),
        "delay_lag_max_ms": round(max(h.lag_max_s.values(), default=0.0) * 1e3, 4),
        "cpu_steal": round(h.steal_share, 4),
        "cpu_pressure": "" if h.pressure_share is None else round(h.pressure_share, 4),
        "run_queue": round(h.runq_mean, 3),
        "run_queue_max": round(h.runq_max, 3),
        "shaping_drops": sum(h.drops.values()),
        "bubbletea_cpu": "" if h.bubbletea_cpu_share is None else round(h.bubbletea_cpu_share, 4),
        "timing_error": "" if b is None else round(b.total, 4),
        "cpu_class": cpu_class_summary(h.cpu_class),
    }


def cpu_class_summary(classes: dict[str, str]) -> str:
    """One word for the run's time-critical processes: `realtime` or `nice` when all ran in it, else how many
    of how many had the real-time class ("" when none reported)."""
    kinds = set(classes.values())
    if len(kinds) <= 1:
        return kinds.pop() if kinds else ""
    rt = sum(c == "realtime" for c in classes.values())
    return f"mixed ({rt} of {len(classes)} realtime)"


def delay_cpu_class(path: str) -> str | None:
    """The CPU class a delay line's stats file names (None: no file, or a line that does not say)."""
    try:
        with open(path) as f:
            cls = json.load(f).get("cpu_class")
    except (OSError, ValueError, AttributeError):
        return None
    return cls if cls in ("realtime", "nice") else None


def cpu_times() -> list[int]:
    """The machine's CPU time counters (/proc/stat's `cpu` line, in clock ticks)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def steal_share(before: list[int], after: list[int]) -> float:
    """Share of the CPU time the hypervisor gave to someone else between two `cpu_times` (the 8th field)."""
    d = [a - b for a, b in zip(after, before, strict=False)]
    total = sum(d[:8])  # guest time is counted in user time already
    return d[7] / total if total > 0 and len(d) > 7 else 0.0


def cpu_pressure_us() -> int | None:
    """/proc/pressure/cpu's `some` total (microseconds some task waited for a CPU), None without PSI."""
    try:
        with open("/proc/pressure/cpu") as f:
            line = f.readline()
    except OSError:
        return None
    return int(line.rsplit("total=", 1)[1]) if "total=" in line else None


def procs_running() -> int:
    """Runnable tasks now (/proc/stat `procs_running`), the reader itself left out."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("procs_running"):
                return max(0, int(line.split()[1]) - 1)
    return 0


class RunQueue:
    """Samples the run queue every RUNQ_PERIOD_S from a thread of its own, until stopped."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runq", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(RUNQ_PERIOD_S):
            self.samples.append(procs_running())

    def start(self) -> RunQueue:
        self._thread.start()
        return self

    def stop(self) -> tuple[float, float]:
        """(mean, max) runnable tasks per CPU over the samples."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        cpus = os.cpu_count() or 1
        if not self.samples:
            return 0.0, 0.0
        return sum(self.samples) / len(self.samples) / cpus, max(self.samples) / cpus


def delay_stats(path: str) -> dict[str, tuple[int, float, float]]:
    """A delay line's stats file: per queue (released packets, sum of their lag (release - due) in s, worst lag
    in s)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {q: (int(v.get("released", 0)), float(v.get("lag_sum_s", 0.0)), float(v.get("lag_max_us", 0.0)) / 1e6)
            for q, v in data.get("queues", {}).items()}


def poke(control_path: str) -> None:
    """Ask a delay line to write its stats file now (an empty control message)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"{}", control_path)


def qdisc_drops(tc_json: str) -> int:
    """Packets dropped by the root qdiscs of `tc -s -j qdisc show` (a root counts its classes' drops)."""
    try:
        qdiscs = json.loads(tc_json or "[]")
    except ValueError:
        return 0
    return sum(int(q.get("drops", 0)) for q in qdiscs if q.get("root"))


def lag_over(before: dict[str, tuple[int, float, float]], after: dict[str, tuple[int, float, float]]
             ) -> tuple[float, float]:
    """(mean lag of the packets released between two `delay_stats`, worst lag so far) over the queues."""
    n = sum(a[0] - before.get(q, (0, 0.0, 0.0))[0] for q, a in after.items())
    s = sum(a[1] - before.get(q, (0, 0.0, 0.0))[1] for q, a in after.items())
    worst = max((a[2] for a in after.values()), default=0.0)
    return (s / n if n > 0 else 0.0), worst


BUBBLETEA_ROLES = ("testbed.bubbletea.service", "testbed.bubbletea.decode", "testbed.bubbletea.kvsend")
KV_LINE_MARK = ".kv.delay.json"  # a KV delay line's stats file (testbed/emu/kvdelay.py)


def proc_table() -> dict[int, tuple[int, str, float]]:
    """Every process: pid -> (parent pid, command line, CPU seconds used so far, its threads' included)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        rest = st[st.rfind(")") + 2:].split()
        out[int(d)] = (int(rest[1]), cmd, (int(rest[11]) + int(rest[12])) / tick)
    return out


def bubbletea_cpu_s(table: dict[int, tuple[int, str, float]], run_dir: str) -> dict[int, float]:
    """pid -> CPU seconds of the run's BubbleTea processes in `table` (`proc_table`): those started with a file of
    `run_dir` (the service, the decode processes, the KV delay lines), and a worker's KV sender (its child)."""
    def ours(cmd: str) -> bool:
        return run_dir in cmd and (any(r in cmd for r in BUBBLETEA_ROLES) or KV_LINE_MARK in cmd)

    out = {}
    for pid, (ppid, cmd, cpu) in table.items():
        parent = table.get(ppid, (0, "", 0.0))[1]
        if ours(cmd) or ("testbed.bubbletea.kvsend" in cmd and run_dir in parent):
            out[pid] = cpu
    return out


def cpu_share(before: dict[int, float], after: dict[int, float], wall_s: float, cpus: int) -> float:
    """The share of `cpus` x `wall_s` the processes took between two `bubbletea_cpu_s` (those that started in
    between count whole; those that ended are lost, so the share is a lower bound)."""
    used = sum(c - before.get(pid, 0.0) for pid, c in after.items())
    return max(0.0, used) / (wall_s * cpus) if wall_s > 0 and cpus > 0 else 0.0


@dataclass
class _Start:
    cpu: list[int]
    pressure: int | None
    wall: float
    delay: dict[str, dict]
    drops: dict[str, int]
    bubbletea: dict[int, float] = field(default_factory=dict)


class Meter:
    """Measures the machine and the emulated WAN over a run: `start()` before the first iteration, `stop()` after
    the last; the workers' waits are added as they report them (`add_waits`)."""

    def __init__(self, emu) -> None:
        self.emu = emu
        self.health = Health()
        self._start: _Start | None = None
        self._runq = RunQueue()

    def _links(self) -> list[tuple[str, str, float]]:
        """(link name, WAN node, round trip s) of every WAN link."""
        return [(f"{w.a}-{w.b}", w.ns, self.emu.link(w.a, w.b).rtt_s) for w in self.emu.addr.wans]

    def _delay(self) -> dict[str, dict]:
        """WAN link (or `link|machine`: one half of a link between machines) -> its delay line's stats."""
        from testbed.emu import state
        from testbed.emu.build import delay_control

        remote = self.emu.backend.delay_stats()
        if remote is not None:
            return remote
        out = {}
        for _name, ns, _rtt in self._links():
            if ns in self.emu.delaylines:
                poke(delay_control(self.emu, ns))
        if self.emu.delaylines:
            time.sleep(POKE_WAIT_S)
        for name, ns, _rtt in self._links():
            if ns in self.emu.delaylines:
                out[name] = delay_stats(str(state.run_dir(self.emu.prefix) / f"{ns}.delay.json"))
        return out

    def _drops(self) -> dict[str, int]:
        out = {}
        for name, ns, _rtt in self._links():
            try:
                text = self.emu.backend.run(self.emu.node(ns), ["tc", "-s", "-j", "qdisc", "show"], check=False)
            except Exception:  # noqa: BLE001 (health is best effort: a node gone says nothing of the timing)
                continue
            out[name] = qdisc_drops(text)
        return out

    def _bubbletea(self) -> dict[int, float]:
        from testbed.emu import state

        return bubbletea_cpu_s(proc_table(), str(state.run_dir(self.emu.prefix)))

    def start(self) -> Meter:
        self._start = _Start(cpu_times(), cpu_pressure_us(), time.monotonic(), self._delay(), self._drops(),
                             self._bubbletea())
        self._runq.start()
        return self

    def add_waits(self, host: str, waits: list[float] | None, wakes: list[float] | None = None) -> None:
        if waits:
            self.health.waits.setdefault(host, WaitTotals()).add(waits)
        if wakes:
            self.health.wakes.add(wakes)

    def add_cpu_class(self, who: str, cls: str | None) -> None:
        if cls:
            self.health.cpu_class[who] = cls

    def abort(self) -> None:
        """Stop sampling without a result (the run failed)."""
        self._runq.stop()

    def stop(self) -> Health:
        h, s = self.health, self._start
        h.runq_mean, h.runq_max = self._runq.stop()
        if s is None:
            return h
        h.steal_share = steal_share(s.cpu, cpu_times())
        p = cpu_pressure_us()
        wall = time.monotonic() - s.wall
        if p is not None and s.pressure is not None and wall > 0:
            h.pressure_share = min(1.0, (p - s.pressure) / 1e6 / wall)
        bt = self._bubbletea()
        if bt or s.bubbletea:
            h.bubbletea_cpu_share = cpu_share(s.bubbletea, bt, wall, os.cpu_count() or 1)
        after = self._delay()
        for name, _ns, rtt in self._links():
            h.rtt_s[name] = rtt
        for key in after:  # a link split between machines has a delay line per half: the later one counts
            name = key.split("|")[0]
            mean, worst = lag_over(s.delay.get(key, {}), after[key])
            if name not in h.lag_mean_s or abs(mean) > abs(h.lag_mean_s[name]):
                h.lag_mean_s[name] = mean
            h.lag_max_s[name] = max(worst, h.lag_max_s.get(name, worst))
        for name, n in self._drops().items():
            h.drops[name] = max(0, n - s.drops.get(name, 0))
        self._delay_classes()
        return h

    def _delay_classes(self) -> None:
        """Each local delay line's CPU class, from its stats file (a cluster's lines report only their lag)."""
        from testbed.emu import state

        for name, ns, _rtt in self._links():
            if ns in self.emu.delaylines:
                self.add_cpu_class(f"delay line {name}", delay_cpu_class(str(state.run_dir(self.emu.prefix) /
                                                                              f"{ns}.delay.json")))

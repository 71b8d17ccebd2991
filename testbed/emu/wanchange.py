"""A WAN that changes, live, on the emulated network: the link schedule of testbed/sim/linkchange.py applied
while an emulated training run goes on, on the same clock as the simulator's.

The schedule's clock is the run's timeline: seconds of training from the first iteration's start, the
barriers between iterations left out. So a change is applied at `iteration start + (t - clock at that start)`;
one that falls in a barrier is applied as the next iteration starts, as in the simulator (iterations back to
back). At each change, on the link's WAN node:
- rate: the link's HTB classes (1:1 and its default class 1:10, both directions), one `tc -batch`; the Atlas
  sidecar, when one runs, is told the new rate and re-rates its per-replica classes (testbed/runtime/sidecar.py);
- down: the delay line holds (testbed/emu/delayline.py): what is already on the wire arrives, what comes
  waits until the link is up and leaves one latency later; TCP stops when its window is full. Nothing is
  dropped, so TCP does not back off (a real failure drops packets and TCP's retransmission timer adds to the
  outage: that is not emulated). HTB is left alone: at a rate near zero one jumbo frame leaves HTB's token
  bucket owing seconds, which it still owes after the rate comes back.
- latency: the delay line's queues (its control socket), or netem's delay where the kernel has netem.

Every change is recorded with the time it took effect. A sampler reads each WAN egress's transmitted bytes
every 20 ms (from /proc/PID/net/dev of the delay line, a process inside the WAN namespace: a file read,
cheaper than a netlink dump on a busy 2-core machine), which gives each link's throughput over time. The
delay line records each hold (when its first packet came, when it ended): the time transfers waited on a
link that was down.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass

from testbed.emu import state
from testbed.emu.build import Emulation, delay_control
from testbed.emu.sh import EmuError
from testbed.emu.shaping import ACK_MINOR, DEFAULT_MINOR, leaf_command, rate_change_commands
from testbed.net.units import bps_to_gbps, bytes_s_to_bps, s_to_ms
from testbed.runtime.wire import send_ctrl
from testbed.sim.linkchange import Pair, WanSchedule, WanState

SAMPLE_S = 0.02


@dataclass
class Applied:
    pair: Pair
    t_s: float  # when the schedule has it
    state: WanState
    iteration: int  # the iteration during (or before) which it was applied
    wall: float  # monotonic time it took effect (after the tc changes)
    apply_s: float  # how long applying it took


class LiveWan:
    """Applies a WanSchedule to `emu` during a run; `begin`/`end` bracket each iteration."""

    def __init__(self, emu: Emulation, wan: WanSchedule, scale: float, links: list[Pair],
                 sidecars: dict[frozenset, str] | None = None) -> None:
        self.emu, self.wan, self.scale = emu, wan, scale
        self.sidecar_paths = sidecars or {}
        self.sidecars: dict[frozenset, socket.socket] = {}
        # links shared fairly: their replica classes per device (emu/train.py classify_replicas), re-rated with them
        self.fair_classes: dict[frozenset, dict[str, tuple[int, ...]]] = {}
        # BubbleTea's KV class per device (emu/train.py add_kv_classes): (minor, on a link with Atlas's turns)
        self.kv_classes: dict[frozenset, dict[str, tuple[int, bool]]] = {}
        # every class under a link's default one, per device (replica, sidecar and KV classes): with netem each has
        # a delaying leaf of its own (emu/shaping.py leaf_command), changed with the default class's
        self.leaves: dict[frozenset, dict[str, tuple[int, ...]]] = {}
        self.applied: list[Applied] = []
        self.samples: list[tuple[int, float, str, int]] = []  # (iteration, wall, "a>b", bytes sent so far)
        self.watch = [(w.ns, dev, f"{other}>{dev}") for a, b in links for w in [emu.addr.wan(a, b)]
                      for dev, other in ((w.a, w.b), (w.b, w.a))]
        self.latency: dict[Pair, float] = {}
        self.up: dict[Pair, bool] = {}
        self.next = 0  # index into wan.changes
        self.window: tuple[int, float, float] | None = None  # (iteration, wall start, clock start)
        self.cond = threading.Condition()
        self.stop = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.dl = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.started = False

    # --- control sockets ------------------------------------------------------------------------
    def _notify_sidecar(self, pair: Pair, bps: float, notice_delay_s: float | None = None) -> None:
        path = self.sidecar_paths.get(frozenset(pair))
        if path is None:
            return
        try:
            if frozenset(pair) not in self.sidecars:
                s = socket.socket(socket.AF_UNIX)
                s.connect(path)
                self.sidecars[frozenset(pair)] = s
            msg = {"op": "link", "link_bps": bps}
            if notice_delay_s is not None:  # the delay line's latency, ahead of the shaper (runtime/sidecar.py)
                msg["notice_delay_s"] = notice_delay_s
            send_ctrl(self.sidecars[frozenset(pair)], msg)
        except OSError:
            self.sidecar_paths.pop(frozenset(pair), None)  # the run reports a lost sidecar itself

    def prepare(self) -> None:
        """Before the first iteration: sidecar connections open, every changing link set to its state at 0."""
        if self.wan.outages() and self.emu.delay != "nfqueue":
            raise EmuError(f"a link outage is emulated by the delay line, and this run delays with "
                           f"{self.emu.delay}; set emulation.delay: nfqueue")
        for pair in self.wan.links:
            self.latency[pair] = self.emu.topo.link(*pair).latency_ms / 1e3  # what `up` built
            self.up[pair] = True
            st = self.wan.state_at(pair, 0.0)
            dt = self.apply(pair, st)
            self.applied.append(Applied(pair, 0.0, st, 0, time.monotonic(), dt))
        self.next = self.wan.after(0.0)
        self.started = True
        self.thread.start()

    def _delayline(self, ns: str, msg: dict) -> None:
        self.dl.sendto(json.dumps(msg).encode(), delay_control(self.emu, ns))

    def apply(self, pair: Pair, st: WanState) -> float:
        """Put link `pair` in state `st` now; returns the seconds it took."""
        t0 = time.monotonic()
        w = self.emu.addr.wan(*pair)
        rate = bytes_s_to_bps(st.capacity_bytes_s) / self.scale
        if not st.up and self.up.get(pair, True):
            self._delayline(w.ns, {"hold": True})
        fair, kv = self.fair_classes.get(frozenset(pair), {}), self.kv_classes.get(frozenset(pair), {})
        batch = "".join(" ".join(cmd[1:]) + "\n" for dev in (w.a, w.b)
                        for cmd in rate_change_commands(dev, rate, self.emu.mtu(*pair), fair.get(dev, ()),
                                                        kv.get(dev)))
        self.emu.backend.run(self.emu.node(w.ns), ["tc", "-batch", "-"], input=batch)
        self._notify_sidecar(pair, rate, st.latency_s if self.emu.delay == "nfqueue" else None)
        if st.up and not self.up.get(pair, True):
            self._delayline(w.ns, {"hold": False})
        self.up[pair] = st.up
        if self.latency.get(pair) != st.latency_s:
            ms = s_to_ms(st.latency_s)
            if self.emu.delay == "nfqueue":
                self._delayline(w.ns, {"delays_ms": {"0": ms, "1": ms}})
            elif self.emu.delay == "netem":
                leaves = self.leaves.get(frozenset(pair), {})
                batch = "".join(" ".join(leaf_command(dev, minor, rate, 2 * st.latency_s, ms, "change")[1:]) + "\n"
                                for dev in (w.a, w.b) for minor in (DEFAULT_MINOR, ACK_MINOR, *leaves.get(dev, ())))
                self.emu.backend.run(self.emu.node(w.ns), ["tc", "-batch", "-"], input=batch)
            self.latency[pair] = st.latency_s
        return time.monotonic() - t0

    # --- the run's clock --------------------------------------------------------------------------
    def begin(self, iteration: int, wall_start: float, clock: float) -> None:
        """Iteration `iteration` starts at monotonic `wall_start`, at `clock` on the timeline: changes due by
        then are applied now (at the first iteration, every changing link is set to its state at 0)."""
        if not self.started:
            self.prepare()
        self._due(iteration, clock)
        with self.cond:
            self.window = (iteration, wall_start, clock)
            self.cond.notify_all()

    def end(self) -> None:
        """The iteration is over (the barrier): nothing is applied until the next begins."""
        with self.cond:
            self.window = None
        if self.error is not None:
            raise self.error

    def _due(self, iteration: int, clock: float) -> None:
        changes = self.wan.changes
        while self.next < len(changes) and changes[self.next][0] <= clock:
            t, _, pair, st = changes[self.next]
            dt = self.apply(pair, st)
            self.applied.append(Applied(pair, t, st, iteration, time.monotonic(), dt))
            self.next += 1

    def _run(self) -> None:
        try:
            next_sample = time.monotonic()
            while True:
                with self.cond:
                    while self.window is None and not self.stop:
                        self.cond.wait()
                    if self.stop:
                        return
                    it, w0, c0 = self.window  # type: ignore[misc]
                now = time.monotonic()
                if now >= w0:
                    self._due(it, c0 + now - w0)
                    if now >= next_sample:
                        self._sample(it)
                        next_sample = now + SAMPLE_S
                wake = next_sample
                if self.next < len(self.wan.changes):
                    wake = min(wake, w0 + self.wan.changes[self.next][0] - c0)
                with self.cond:
                    if self.window is not None and not self.stop:
                        self.cond.wait(max(0.0, max(wake, w0) - time.monotonic()))
        except BaseException as e:  # noqa: BLE001 (reported to the orchestrator at the next barrier)
            self.error = e

    def _sent(self, ns: str) -> dict[str, int]:
        """Bytes each interface of WAN namespace `ns` has transmitted: /proc/PID/net/dev of the delay line
        (a process in that namespace), or the namespace's /proc/net/dev where there is none (netem, containers)."""
        p = self.emu.delaylines.get(ns)
        if p is not None and self.emu.backend.name == "netns":
            with open(f"/proc/{p.pid}/net/dev") as f:
                text = f.read()
        else:
            text = self.emu.backend.run(self.emu.node(ns), ["cat", "/proc/net/dev"])
        lines = text.splitlines()[2:]
        return {ln.split(":")[0].strip(): int(ln.split(":")[1].split()[8]) for ln in lines}

    def _sample(self, iteration: int) -> None:
        for ns in dict.fromkeys(ns for ns, _, _ in self.watch):
            t = time.monotonic()
            sent = self._sent(ns)
            for ns2, dev, name in self.watch:
                if ns2 == ns:
                    self.samples.append((iteration, t, name, sent.get(dev, 0)))

    def close(self) -> None:
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        if self.thread.is_alive():
            self.thread.join(2)
        for pair, up in self.up.items():  # never leave a link holding
            if not up:
                with contextlib.suppress(OSError):
                    self._delayline(self.emu.addr.wan(*pair).ns, {"hold": False})
        for s in self.sidecars.values():
            s.close()
        self.dl.close()

    # --- what happened, on the timeline's clock ---------------------------------------------------
    def report(self, run_id: str, starts: list[float], durations: list[float]):
        """(LINKRATES rows, LINKCHANGES rows, stall intervals) on the timeline's clock; `starts` are the
        iterations' monotonic start times, `durations` their lengths. Rates are real-world (times the scale)."""
        from testbed.results import fmt

        clock0 = [sum(durations[:k]) for k in range(len(durations))]

        def clock(it: int, wall: float) -> float:
            c = clock0[it] + wall - starts[it]
            if c > clock0[it] + durations[it]:  # in the barrier after the iteration: as the next one starts
                c = clock0[it] + durations[it]
            return max(c, clock0[it])

        changes = []
        for a in self.applied:
            at = clock(a.iteration, a.wall)
            changes.append((run_id, "emu", f"{a.pair[0]}-{a.pair[1]}", fmt(a.t_s, 9), fmt(at, 6),
                            fmt(a.state.gbps, 9), fmt(s_to_ms(a.state.latency_s), 9), int(a.state.up),
                            round(s_to_ms(a.apply_s), 3)))
        rates: list[tuple] = []
        last: dict[str, tuple[float, int]] = {}
        for it, wall, name, sent in self.samples:
            if not starts[it] <= wall <= starts[it] + durations[it]:
                continue
            c = clock(it, wall)
            if name in last and c > last[name][0]:
                t0, b0 = last[name]
                real_gbps = bps_to_gbps(bytes_s_to_bps(sent - b0) * self.scale / (c - t0))  # k x the emulated rate
                rates.append((run_id, "emu", name, fmt(t0, 6), fmt(real_gbps, 6)))
            last[name] = (c, sent)

        def clock_of(wall: float) -> float:
            k = max([0] + [i for i, s in enumerate(starts) if s <= wall])
            return clock(k, wall)

        stalls = []
        t_first, t_last = (starts[0], starts[-1] + durations[-1]) if starts else (0.0, 0.0)
        for pair in self.wan.links:
            ns = self.emu.addr.wan(*pair).ns
            f = state.run_dir(self.emu.prefix) / f"{ns}.delay.json"
            holds = json.loads(f.read_text()).get("holds", []) if f.exists() else []
            for h in holds:
                if h["packets"] and h["first"] is not None and t_first <= h["to"] and h["first"] <= t_last:
                    stalls.append((clock_of(h["first"]), clock_of(h["to"])))
        return rates, changes, stalls

"""The machine's headroom for an emulated run, measured in a short probe before it starts, and what follows from
it: the emulation scale k (the fastest WAN link's emulated rate) and whether the workers' timing will hold.

The emulation's own CPU work grows with its packet rate (the delay line and HTB handle each packet; the delay line
is CPU-bound near 1 Gbit/s on one core: docs/emulation.md), and its timing error with how late the machine's
timers wake (testbed/emu/health.py). On a machine with less than a free CPU, or whose timers wake late, the links
are run slower (a larger k, down to 100 Mbit/s, the low end of the emulator's range); a user's explicit k is kept,
with a warning where it will not hold.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from testbed.emu.health import cpu_times, critical_steps, procs_running
from testbed.emu.scale import TARGET_MBPS, auto_scale

LOW_MBPS = 100.0  # the slowest the emulator runs its fastest link for headroom (the design's 100-200 Mbit/s)
FULL_FREE_CPUS = 1.0  # free CPUs at which the fastest link runs at TARGET_MBPS
LATE_WAKE_S = 0.5e-3  # timers waking this late on average: the machine is busy (idle: 0.05-0.1 ms)
PROBE_SLEEP_S = 1e-3


@dataclass(frozen=True)
class Headroom:
    """What a probe measured: the CPUs, how busy others kept them, how late a 1 ms timed sleep woke."""

    cpus: int
    busy_share: float  # of all CPUs' time, busy with other work during the probe (0-1)
    steal_share: float
    runnable_per_cpu: float  # mean of the samples
    wake_late_mean_s: float
    wake_late_p90_s: float
    probe_s: float

    @property
    def free_cpus(self) -> float:
        return self.cpus * max(0.0, 1.0 - self.busy_share - self.steal_share)


def probe(seconds: float = 1.0) -> Headroom:
    """Sleep PROBE_SLEEP_S again and again for `seconds`, timing each wake-up, while counting the machine's CPU time
    and run queue: what an emulated run's workers and delay lines would meet now."""
    before, t0 = cpu_times(), time.monotonic()
    t_end = t0 + seconds  # the probe lasts `seconds` from the start it reports (probe_s >= seconds)
    late: list[float] = []
    runq: list[int] = []
    while time.monotonic() < t_end:
        a = time.monotonic()
        time.sleep(PROBE_SLEEP_S)
        late.append(max(0.0, time.monotonic() - a - PROBE_SLEEP_S))
        if len(late) % 20 == 0:
            runq.append(procs_running())
    after, wall = cpu_times(), time.monotonic() - t0
    d = [x - y for x, y in zip(after, before, strict=False)]
    total = sum(d[:8]) or 1
    idle = d[3] + (d[4] if len(d) > 4 else 0)
    steal = d[7] / total if len(d) > 7 else 0.0
    late.sort()
    cpus = os.cpu_count() or 1
    return Headroom(cpus=cpus, busy_share=max(0.0, 1.0 - idle / total - steal), steal_share=steal,
                    runnable_per_cpu=sum(runq) / len(runq) / cpus if runq else 0.0,
                    wake_late_mean_s=sum(late) / len(late) if late else 0.0,
                    wake_late_p90_s=late[int(0.9 * (len(late) - 1))] if late else 0.0, probe_s=wall)


def target_mbps(h: Headroom) -> float:
    """The fastest link's emulated rate this machine can carry with its timing kept: TARGET_MBPS with a free CPU
    and timers on time, falling linearly to LOW_MBPS with half a free CPU or none, and LOW_MBPS when timers wake
    late."""
    if h.wake_late_mean_s > LATE_WAKE_S:
        return LOW_MBPS
    f = min(1.0, max(0.0, (h.free_cpus - 0.5) / (FULL_FREE_CPUS - 0.5)))
    return LOW_MBPS + f * (TARGET_MBPS - LOW_MBPS)


@dataclass(frozen=True)
class Sizing:
    """The k a run will use, and what the user should know about it."""

    scale: float
    target_mbps: float
    warnings: tuple[str, ...]


def size(topo, h: Headroom, explicit: float | None) -> Sizing:
    """k for `topo` on this machine: the smallest that brings the fastest link to `target_mbps(h)` unless the user
    chose one (`explicit`, kept, with a warning where it runs the fastest link faster than that)."""
    target = target_mbps(h)
    fastest = max((link.gbps for link in topo.links), default=0.0)
    if not explicit:
        return Sizing(float(f"{auto_scale(topo, target):.4g}"), target, ())
    warn = ()
    rate = fastest * 1e3 / explicit
    if rate > target * 1.01:
        warn = (f"k={explicit:g} runs the fastest link at {rate:.0f} Mbit/s, more than this machine's headroom "
                f"carries with its timing kept ({target:.0f} Mbit/s: {h.free_cpus:.1f} free CPUs, timers "
                f"{h.wake_late_mean_s * 1e3:.2f} ms late); k >= {fastest * 1e3 / target:.4g} would hold",)
    return Sizing(explicit, target, warn)


def worker_warning(h: Headroom, pp: int, dp: int, microbatches: int, wan_boundaries: int, iteration_s: float,
                   limit: float) -> str:
    """A warning ("" if none) when the workers' timed waits, late as the probe's, would take the run over its
    timing budget `limit` (the critical path's waits x the probe's lateness, over the predicted iteration time),
    or when there are more workers than the machine has free CPUs for their wake-ups."""
    waits, _ = critical_steps(pp, microbatches, wan_boundaries)
    predicted = waits * h.wake_late_mean_s / iteration_s if iteration_s > 0 else 0.0
    workers = pp * dp
    if predicted > limit:
        return (f"{workers} workers (pp {pp} x dp {dp}): timers here wake {h.wake_late_mean_s * 1e3:.2f} ms late, "
                f"which can cost {predicted:.1%} of a {iteration_s:.3g} s iteration, over the {limit:.1%} budget: "
                f"expect degraded runs; use fewer workers or a quieter machine")
    if h.free_cpus < 0.5:
        return (f"{workers} workers (pp {pp} x dp {dp}) on {h.free_cpus:.1f} free CPUs of {h.cpus}: others keep the "
                f"machine busy, so the run's timing may not hold (each run's timing_error says)")
    return ""

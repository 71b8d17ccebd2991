"""Each machine's CLOCK_MONOTONIC against the driver's. Real servers each count from their own boot, so the go times
sent to workers, the workers' logs, the striped transfers' send stamps and the sidecars' forwarded ends must be
translated between machines (containers on one host share one clock). An offset is measured NTP-style: ROUND_TRIPS
agent calls that return the agent's monotonic time, the one with the shortest round trip kept (the least queueing:
its midpoint is nearest the instant the agent read its clock), its uncertainty half that round trip. Offsets are
applied, never corrected for drift: a run is minutes long and monotonic clocks drift by microseconds a second, so
`down` measures again and only warns past MAX_DRIFT_S. Pure but for `measure` (one Ray call per sample); the
translations themselves are the emulation's (testbed/emu/train.py `to_machine`, `in_our_clock`; the workers'
Striped and Inbox; the sidecar's `forward_clock_s`; testbed/emu/check.py `bulk`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from testbed.emu.sh import EmuError

ROUND_TRIPS = 16  # samples per machine; the shortest round trip is kept
SHARED_SLACK_S = 0.001  # an offset this far beyond its uncertainty still reads as one shared clock
MAX_UNCERTAINTY_S = 0.005  # above this, iteration times and turn hand-overs would carry the error: refused
MAX_DRIFT_S = 0.005  # a clock that moved this much against the driver's between up and down is named


@dataclass(frozen=True)
class ClockOffset:
    """A machine's CLOCK_MONOTONIC minus the driver's (`offset_s`: 0 when it shares the driver's clock)."""

    machine: str
    offset_s: float  # what is applied: the machine's time = the driver's + offset_s
    uncertainty_s: float  # half the round trip of the sample it came from
    measured_s: float  # the raw estimate (also when the shared-clock fast path applies 0)

    @property
    def shared(self) -> bool:
        return self.offset_s == 0.0


def estimate(machine: str, samples: list[tuple[float, float, float]]) -> ClockOffset:
    """The offset from (driver before, machine's clock, driver after) samples: the one with the shortest round trip.
    Within its uncertainty (+ SHARED_SLACK_S) of 0 the clock is taken as shared: 0 applied, so on one host nothing is
    translated and a run reads exactly as before."""
    if not samples:
        raise ValueError(f"machine {machine}: no clock samples")
    t0, there, t1 = min(samples, key=lambda s: s[2] - s[0])
    off, unc = there - (t0 + t1) / 2, (t1 - t0) / 2
    return ClockOffset(machine, 0.0 if abs(off) <= unc + SHARED_SLACK_S else off, unc, off)


def check(offsets: dict[str, ClockOffset], limit_s: float = MAX_UNCERTAINTY_S) -> None:
    """Refuse, naming the machine, an offset known no better than `limit_s`."""
    for o in offsets.values():
        if o.uncertainty_s > limit_s:
            raise EmuError(f"machine {o.machine}: its clock's offset from the driver's is known only to "
                           f"+-{o.uncertainty_s * 1e3:.1f} ms (the fastest of {ROUND_TRIPS} Ray calls took "
                           f"{2 * o.uncertainty_s * 1e3:.1f} ms; at most {limit_s * 1e3:g} ms): run testbed on a node "
                           f"with a faster path to it, or on a less loaded driver")


def measure(names: list[str], read: Callable[[str], float], rounds: int = ROUND_TRIPS) -> dict[str, ClockOffset]:
    """Each machine's offset from `rounds` calls of `read(machine)` (its CLOCK_MONOTONIC, through its agent)."""
    out = {}
    for name in names:
        samples = []
        for _ in range(rounds):
            t0 = time.monotonic()
            there = read(name)
            samples.append((t0, there, time.monotonic()))
        out[name] = estimate(name, samples)
    return out


def drift(before: dict[str, ClockOffset], after: dict[str, ClockOffset], limit_s: float = MAX_DRIFT_S) -> list[str]:
    """A line per machine whose clock moved more than `limit_s` (beyond both measurements' uncertainty) against the
    driver's between two measurements."""
    out = []
    for name, b in before.items():
        a = after.get(name)
        if a is None:
            continue
        moved = a.measured_s - b.measured_s
        if abs(moved) > limit_s + a.uncertainty_s + b.uncertainty_s:
            out.append(f"machine {name}'s clock moved {moved * 1e3:+.1f} ms against the driver's during the run "
                       f"(more than {limit_s * 1e3:g} ms): its times were translated with the offset measured at the "
                       f"start, so the run's timeline may be off by that much")
    return out


def describe(offsets: dict[str, ClockOffset]) -> str:
    """One line: each machine's clock against the driver's."""
    parts = [f"{o.machine} {'shared' if o.shared else f'{o.offset_s:+.3f} s'} (+-{o.uncertainty_s * 1e3:.2f} ms)"
             for o in offsets.values()]
    return "clocks against the driver's: " + ", ".join(parts)

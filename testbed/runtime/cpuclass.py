"""The CPU class of the emulation's time-critical threads: Linux real-time round robin, or a nice value.

An emulated link or a modeled GPU keeps its timing only if its thread runs when its deadline comes; on a busy
machine a normal (CFS) thread waits behind every other runnable one, and the emulator's lateness shows up as
simulator error (docs/reliability.md). A thread in SCHED_RR at a low priority preempts every normal thread
instead. Only threads that sleep until a deadline and then do a little work take it (delay lines, Atlas
sidecars, the workers' program, sender and reader threads): anything that can spin or move bulk data (KV
shipping, load generators) stays normal, and SCHED_RESET_ON_FORK makes every thread or process such a thread
starts begin as a normal one, so nothing inherits the class by accident.

Safety: the class is taken only while the kernel's real-time throttling is on (kernel.sched_rt_runtime_us not
-1: real-time threads get at most that share of each period, 95 % by default, so normal tasks always run).

Modes (`emulation.realtime`): `auto` takes the class where the system allows it and otherwise keeps the nice
value, saying why once per process; `on` refuses to run without it; `off` keeps the nice value. Standard library
only (role processes: tests/test_role_imports.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

MODES = ("auto", "on", "off")
WORKER_PRIORITY = 1  # the lowest real-time priority: above every normal thread, below the kernel's own
LINK_PRIORITY = 2  # the emulated network (delay lines, sidecars) ahead of the workers it carries
REALTIME, NICE = "realtime", "nice"
RT_RUNTIME = "/proc/sys/kernel/sched_rt_runtime_us"

_said = threading.Event()  # the fallback is reported once per process


class RealtimeError(RuntimeError):
    """`realtime: on` where the class cannot be had."""


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"realtime mode {mode!r}: use one of {', '.join(MODES)}")
    return mode


def obstacle(rt_runtime_path: str = RT_RUNTIME) -> str:
    """Why this system must not give a thread the class ("" if it may): real-time throttling off or unknown."""
    try:
        with open(rt_runtime_path) as f:
            runtime_us = int(f.read().strip())
    except (OSError, ValueError):
        return f"cannot read {rt_runtime_path}"
    if runtime_us < 0:
        return "real-time throttling is off (kernel.sched_rt_runtime_us = -1)"
    return ""


def enter(mode: str, priority: int, nice: int | None = None, name: str = "emulation",
          rt_runtime_path: str = RT_RUNTIME) -> str:
    """Put the calling thread in SCHED_RR at `priority` (mode auto or on), else give it `nice` (None: leave it);
    returns the class it runs in, REALTIME or NICE. Mode `on` raises RealtimeError where the class is refused."""
    why = "emulation.realtime is off" if check_mode(mode) == "off" else obstacle(rt_runtime_path)
    if not why:
        try:
            policy = os.SCHED_RR | os.SCHED_RESET_ON_FORK
            os.sched_setscheduler(0, policy, os.sched_param(priority))  # 0: the calling thread
            return REALTIME
        except (OSError, AttributeError) as e:
            why = f"SCHED_RR refused ({getattr(e, 'strerror', None) or e}; needs root or CAP_SYS_NICE, and "
            why += "real-time runtime in the cgroup)"
    if mode == "on":
        raise RealtimeError(f"{name}: emulation.realtime is on but {why}; set emulation.realtime: auto or off")
    if mode == "auto" and not _said.is_set():
        _said.set()
        print(f"{name}: no real-time CPU class ({why}): nice {0 if nice is None else nice} instead", file=sys.stderr,
              flush=True)
    if nice is not None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    return NICE


def leave() -> None:
    """Back to the normal class for the calling thread (a thread that moves bulk data, if it was started by a
    real-time thread before SCHED_RESET_ON_FORK took effect); nothing where it already is."""
    with contextlib.suppress(OSError, AttributeError):
        if os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK != os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def current() -> str:
    """The calling thread's class: REALTIME or NICE."""
    policy = os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK
    return REALTIME if policy in (os.SCHED_RR, os.SCHED_FIFO) else NICE

"""The KV caches' CPU class: the lowest, as their packets have the lowest class on the WAN.

Shipping a modeled KV cache costs the emulating machine CPU that a real deployment spends on other hardware
(the sender's copies and the kernel's packet path on the decode side run on the cores that also run every
emulated worker). At the default priority that work competes with training's own threads and slows them, an
effect of emulating on shared cores that the simulator (rightly) does not have. A thread or process that only
moves KV caches runs at nice 19, so training's threads are served first and the caches take the CPU they
leave. Standard library only (role processes: tests/test_role_imports.py).
"""

from __future__ import annotations

import contextlib
import os
import threading

from testbed.runtime import cpuclass

KV_NICE = 19


def lowest_cpu_priority(whole_process: bool = False) -> None:
    """Nice 19 for the calling thread (Linux schedules threads apart: setpriority on its thread id), or for the
    whole process; nothing where the system does not allow it. Never in the real-time class: KV shipping moves
    bulk data (testbed/runtime/cpuclass.py)."""
    cpuclass.leave()
    with contextlib.suppress(OSError, AttributeError):
        who = os.getpid() if whole_process else threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, who, KV_NICE)

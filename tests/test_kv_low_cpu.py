"""KV shipping's CPU class (testbed/runtime/lowcpu.py) and the emulated run's slowdown validation rows."""

from __future__ import annotations

import os
import threading

from testbed.runs.emulated import slowdown_validation
from testbed.runtime.lowcpu import KV_NICE, lowest_cpu_priority


def test_the_calling_thread_alone_drops_to_the_lowest_priority():
    main_before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: dict[str, int] = {}

    def kv_sender() -> None:
        lowest_cpu_priority()
        seen["kv"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    t = threading.Thread(target=kv_sender)
    t.start()
    t.join()
    assert seen["kv"] == KV_NICE
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_before


def test_slowdown_validation_pairs_each_emulated_slowdown_with_the_simulators():
    rows = [
        {"run_id": "p00-atlas+bubbletea", "scheduler": "atlas+bubbletea", "source": "sim", "train_slowdown": 0.004},
        {"run_id": "p00-atlas+bubbletea", "scheduler": "atlas+bubbletea", "source": "emu", "train_slowdown": 0.001,
         "train_slowdown_vs_alone": 0.02, "degraded": ""},
        {"run_id": "p00-atlas", "scheduler": "atlas", "source": "sim", "train_slowdown": ""},
        {"run_id": "p00-atlas", "scheduler": "atlas", "source": "emu", "train_slowdown": ""},
    ]
    assert slowdown_validation(rows) == [
        ("p00-atlas+bubbletea", "atlas+bubbletea", "train_slowdown", 0.004, 0.001, "", ""),
        ("p00-atlas+bubbletea", "atlas+bubbletea", "train_slowdown_vs_alone", 0.004, 0.02, "", ""),
    ]

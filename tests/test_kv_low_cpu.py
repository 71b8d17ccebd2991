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


def test_the_kv_delay_line_takes_the_decode_ports_packets_both_ways_into_its_own_queues():
    from types import SimpleNamespace

    from testbed.bubbletea.kvdelay import KV_QUEUES, _rules

    w = SimpleNamespace(a="useast", b="uswest")
    rules = _rules(w, 7900)
    assert {(r[r.index("-i") + 1], r[r.index("-o") + 1], r[-1]) for r in rules} == {
        ("useast", "uswest", str(KV_QUEUES[0])), ("uswest", "useast", str(KV_QUEUES[1]))}
    assert sorted(r[6] for r in rules) == ["--dport", "--dport", "--sport", "--sport"]
    assert all(r[r.index("--dport" if "--dport" in r else "--sport") + 1] == "7900" for r in rules)
    assert not set(KV_QUEUES) & {0, 1}  # training's line binds 0 and 1 (testbed/emu/build.py start_delayline)

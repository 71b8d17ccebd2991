"""Seeing the WAN: per-replica throughput on each WAN egress over time, from HTB class counters.

A sampler thread reads `tc -s class show` in each WAN namespace every 20 ms (a timed wait, not a
spin) while an emulated iteration runs. Each replica's flows have their own class (see
emu/train.py), so the counters show who had the link when: under temporal sharing the replicas
take turns at full rate; under fair sharing they overlap at a fraction each.
"""

from __future__ import annotations

import re
import threading
import time

from testbed.emu.build import Emulation

SENT = re.compile(r"class htb 1:([0-9a-f]+) .*?\n\s*Sent (\d+) bytes", re.S)


class FlowSampler:
    def __init__(self, emu: Emulation, hops: dict, interval_s: float = 0.02) -> None:
        self.emu, self.interval = emu, interval_s
        self.targets = [(link, dev, {int(m): int(r) for r, m in minors.items()})
                        for link, devs in hops.items() for dev, minors in devs.items()]
        self.samples: list[tuple[float, str, str, int, int]] = []  # (t, link, towards, replica, bytes)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FlowSampler:
        if self.targets:
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(2)

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            for (a, b), dev, minors in self.targets:
                node = self.emu.node(self.emu.addr.wan(a, b).ns)
                out = self.emu.backend.run(node, ["tc", "-s", "class", "show", "dev", dev], check=False)
                t = time.monotonic()
                for minor, sent in SENT.findall(out):
                    r = minors.get(int(minor, 16))
                    if r is not None:
                        self.samples.append((t, f"{a}-{b}", dev, r, int(sent)))

"""BubbleTea's KV caches through a delay line of their own on each WAN link, at the lowest CPU priority.

Without netem, every packet of a WAN link passes one user-space delay line (testbed/emu/delayline.py), a process
that costs CPU per packet. The KV caches put more packets on the WAN than training does (emu-bubbletea.yaml: about
twice its bytes), so in the shared line training's packets waited behind the caches' (the line's lag, the timing
health's `delay_lag_ms`, rose from about 2 to 13 ms in a loaded run) and training slowed where the simulator,
whose KV flows take only what training leaves, predicts nothing. Propagation delay is no shared resource on a real
WAN: the caches' packets get the same delay from a second line per WAN node (NFQUEUE numbers KV_QUEUES, fed by
iptables rules for the decode port ahead of training's), running at nice 19, so the CPU goes to training's line
first, as the link's bandwidth does (the KV class, testbed/emu/train.py).

Only on links that do not change (a WAN that changes re-delays the main line alone: there the caches stay in it).
"""

from __future__ import annotations

import contextlib
import subprocess

from testbed.emu import state
from testbed.emu.build import Emulation, _readline
from testbed.emu.sh import EmuError

KV_QUEUES = (2, 3)  # per WAN node, one per direction (training's line: 0 and 1)
KV_NICE = 19


def _rules(w, port: int) -> list[list[str]]:
    """The iptables rule specs (after -A/-I/-D FORWARD) that send the caches' packets, both ways, to KV_QUEUES."""
    out = []
    for q, (src, dst) in zip(KV_QUEUES, ((w.a, w.b), (w.b, w.a)), strict=True):
        for side in ("--dport", "--sport"):
            out.append(["-i", src, "-o", dst, "-p", "tcp", side, str(port), "-j", "NFQUEUE", "--queue-num", str(q)])
    return out


def key(ns: str) -> str:
    """The KV line's name in `emu.delaylines` (stopped with the rest; health and WAN changes look up `ns` only)."""
    return f"{ns}.kv"


def start_kv_delaylines(emu: Emulation, port: int) -> list[str]:
    """A KV delay line per WAN node whose link has a constant delay; returns the WAN nodes it serves."""
    if emu.delay != "nfqueue":
        return []
    done = []
    for w, link in zip(emu.addr.wans, emu.net.links, strict=True):
        delay_ms = emu.link(*link.between).delay_ms
        if link.changes or delay_ms <= 0 or w.ns not in emu.delaylines:
            continue
        wan = emu.node(w.ns)
        rdir = state.run_dir(emu.prefix)
        log = open(rdir / f"{key(w.ns)}.delay.log", "w")  # noqa: SIM115 (owned by the child)
        args = ["--stats-file", str(rdir / f"{key(w.ns)}.delay.json"), "--nice", str(KV_NICE),
                *(f"{q}:{delay_ms}" for q in KV_QUEUES)]
        p = emu.backend.spawn(wan, "testbed.emu.delayline", args, stdout=subprocess.PIPE, stderr=log, text=True,
                              start_new_session=True)
        emu.delaylines[key(w.ns)] = p
        emu.save()
        line = _readline(p, 15.0)
        if line != "ready":
            raise EmuError(f"KV delay line in {w.ns} did not start: {line or 'no output'} (see {log.name})")
        for spec in _rules(w, port):
            emu.backend.run(wan, ["iptables", "-t", "mangle", "-I", "FORWARD", "1", *spec])
        done.append(w.ns)
    return done


def stop_kv_delaylines(emu: Emulation, port: int, served: list[str]) -> None:
    """Best effort: the rules first (the caches' packets go back to the link's line), then the processes."""
    for w in emu.addr.wans:
        if w.ns not in served:
            continue
        for spec in _rules(w, port):
            emu.backend.run(emu.node(w.ns), ["iptables", "-t", "mangle", "-D", "FORWARD", *spec], check=False)
        p = emu.delaylines.pop(key(w.ns), None)
        if p is not None:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    emu.save()

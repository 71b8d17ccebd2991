"""A foreign job's connections carry the emulated window, as the simulator models it.

The training workers clamp each WAN connection's window themselves (runtime/worker.py). A foreign job does
not: its receiver advertises a share of the host's autotuned receive buffer (testbed/emu/build.py
FOREIGN_SHARE, 0.9: the buffer is the window / 0.9), which lands a few bytes either side of the window.
A sender sends whole segments, and an emulated window is a handful of them (14 of 8,948 bytes at k = 50),
so a window advertised a few bytes short of 14 segments carries 13: gloo's connections carried 0.90-0.94
of the emulated window per round trip, and window-bound transfers took 10-16 % longer than modelled. For
the launch each host's buffer is sized for its window plus half a segment, so the advertised window holds
the window's whole segments and not one more. `restore` puts the build's buffers back (for a WAN the launch
found up).
"""

from __future__ import annotations

from testbed.emu.build import Emulation, host_sysctls, receive_buffer


def host_mss(emu: Emulation, dc: str) -> int:
    """The segment size of the host's widest-window WAN link (the one its buffer is sized for)."""
    links = [lk for lk in emu.topo.links if dc in lk.between]
    if not links:
        return 0
    widest = max(links, key=lambda lk: emu.window_bytes(*lk.between))
    return emu.mss(*widest.between)


def launch_rmem(emu: Emulation, dc: str) -> int:
    """A DC host's largest receive buffer for the launch: its window plus half a segment, over the share."""
    return receive_buffer(emu.host_window(dc) + host_mss(emu, dc) // 2)


def rmem_setting(rmem: int) -> str:
    return f"net.ipv4.tcp_rmem=4096 {min(131072, rmem)} {rmem}"


def apply(emu: Emulation) -> None:
    for h in emu.addr.hosts:
        emu.backend.run(emu.node(h.ns), ["sysctl", "-qw", rmem_setting(launch_rmem(emu, h.dc))])


def restore(emu: Emulation) -> None:
    for h in emu.addr.hosts:
        for s in host_sysctls(emu, h.dc):
            if s.startswith("net.ipv4.tcp_rmem="):
                emu.backend.run(emu.node(h.ns), ["sysctl", "-qw", s])

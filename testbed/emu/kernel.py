"""What this kernel offers for emulation, probed in a scratch namespace (never in the root one)."""

from __future__ import annotations

import functools
import os
import shutil

from testbed.emu.sh import EmuError, run

PROBE_NS = f"gdtbp{os.getpid() % 10000}-probe"


def _in_scratch(fn):
    @functools.wraps(fn)
    def wrapper() -> bool:
        run(["ip", "netns", "add", PROBE_NS])
        try:
            run(["ip", "-n", PROBE_NS, "link", "set", "dev", "lo", "up"])
            return fn()
        finally:
            run(["ip", "netns", "del", PROBE_NS], check=False)

    return wrapper


@functools.cache
@_in_scratch
def has_netem() -> bool:
    try:
        run(["tc", "-n", PROBE_NS, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"])
        return True
    except EmuError:
        return False


@functools.cache
@_in_scratch
def has_nfqueue() -> bool:
    if not shutil.which("iptables"):
        return False
    try:
        run(["ip", "netns", "exec", PROBE_NS, "iptables", "-t", "mangle", "-A", "FORWARD", "-j", "NFQUEUE",
             "--queue-num", "0"])
        return True
    except EmuError:
        return False


def require_root() -> None:
    if os.geteuid() != 0:
        raise EmuError("emulation needs root (network namespaces, tc, iptables); run it with sudo or as root")


def delay_method(requested: str = "auto") -> str:
    """netem where the kernel has it, else our NFQUEUE delay line; 'none' only if asked for."""
    if requested == "none":
        return "none"
    if requested in ("auto", "netem") and has_netem():
        return "netem"
    if requested == "netem":
        raise EmuError("this kernel has no netem qdisc; use --delay nfqueue (or auto)")
    if has_nfqueue():
        return "nfqueue"
    raise EmuError("no way to delay packets: no netem and no iptables NFQUEUE; install iptables (make sysdeps)")

"""Remove what the testbed created, and nothing else: only names that carry our `gdtb<id>-` prefix.

Like `mn -c`, but never kills by program name: processes are found by the namespace they run in
(`ip netns pids`), by the PIDs our state files recorded (checked against their command line), or
by Mininet's `mininet:<node>` tag on nodes we named. Containers are found by their `gdtb.prefix`
label. `topology down` is this, for one prefix.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from testbed.emu import state
from testbed.emu.containers import remove_containers
from testbed.emu.names import OURS_RE
from testbed.emu.sh import run


def _ours(name: str, prefix: str | None) -> bool:
    return bool(OURS_RE.match(name)) and (prefix is None or name.startswith(prefix + "-"))


def our_namespaces(prefix: str | None = None) -> list[str]:
    out = run(["ip", "netns", "list"], check=False)
    return [ln.split()[0] for ln in out.splitlines() if ln.strip() and _ours(ln.split()[0], prefix)]


def our_root_links(prefix: str | None = None) -> list[str]:
    """Root-namespace interfaces a Mininet or Containernet build named with our prefix."""
    out = run(["ip", "-o", "link", "show"], check=False)
    names = [ln.split(": ")[1].split("@")[0] for ln in out.splitlines() if ": " in ln]
    return [n for n in names if (n.startswith(prefix) if prefix else n.startswith("gdtb"))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _mininet_pids(prefix: str | None) -> list[int]:
    tag = f"mininet:{prefix or 'gdtb'}"
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and tag in _cmdline(int(d.name)):
            pids.append(int(d.name))
    return pids


def _kill(pids: set[int]) -> None:
    pids.discard(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.05)
        pids = {p for p in pids if Path(f"/proc/{p}").exists()}
        if not pids:
            return


def clean(prefix: str | None = None) -> list[str]:
    """Remove leftovers of one prefix (or of every testbed prefix); return what was removed."""
    removed: list[str] = []
    prefixes = [prefix] if prefix else state.all_prefixes()
    pids: set[int] = set()
    for p in prefixes:
        st = state.load(p) or {}
        for pid in st.get("pids", {}).values():
            if "testbed" in _cmdline(pid):  # not a recycled PID
                pids.add(pid)
    namespaces = our_namespaces(prefix)
    for ns in namespaces:
        pids |= {int(x) for x in run(["ip", "netns", "pids", ns], check=False).split()}
    pids |= set(_mininet_pids(prefix))
    if pids:
        _kill(pids)
        removed.append(f"{len(pids)} process(es)")
    for ns in namespaces:
        run(["ip", "netns", "del", ns], check=False)
        removed.append(f"netns {ns}")
    removed += remove_containers(prefix)
    for link in our_root_links(prefix):
        run(["ip", "link", "del", link], check=False)
        removed.append(f"link {link}")
    for p in prefixes if prefix is None else [prefix]:
        if state.load(p) is not None or state.state_path(p).with_suffix(".tmp").exists():
            removed.append(f"state {p}")
        state.forget(p)
    return removed

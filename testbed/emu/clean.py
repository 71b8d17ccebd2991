"""Remove what the testbed created, and nothing else: only names that carry our `gdtb<id>-` prefix.

Like `mn -c`, but never kills by program name: processes are found by the namespace they run in
(`ip netns pids`), by the PIDs our state files recorded (checked against their command line), or
by Mininet's `mininet:<node>` tag on nodes we named. Containers are found by their `gdtb.prefix`
label. `topology down` is this, for one prefix.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

from testbed.emu import owner, state
from testbed.emu.containers import remove_containers
from testbed.emu.names import OURS_RE, PREFIX_RE
from testbed.emu.owner import our_namespaces  # noqa: F401 (re-exported: listed with the prefixes it holds)
from testbed.emu.sh import EmuError, run


def our_root_links(prefix: str | None = None) -> list[str]:
    """Root-namespace interfaces a Mininet or Containernet build named with our prefix."""
    out = run(["ip", "-o", "link", "show"], check=False)
    names = [ln.split(": ")[1].split("@")[0] for ln in out.splitlines() if ": " in ln]
    return [n for n in names if (root_link_of(n, prefix) if prefix else n.startswith("gdtb"))]


def root_link_of(name: str, prefix: str) -> bool:
    """Named by `prefix`'s build: `<prefix>-...`, a switch `<prefix>s<i>` or a link `<prefix>t<i>a|b`
    (so gdtb1 never claims gdtb10's `gdtb10s0`)."""
    return bool(re.match(re.escape(prefix) + r"(-|s\d+$|t\d+[ab]$)", name))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _mininet_pids(prefix: str | None) -> list[int]:
    """Mininet's node shells carry `mininet:<node>`: hosts `<prefix>-...`, switches `<prefix>s<i>`."""
    tag = re.compile(r"mininet:" + (re.escape(prefix) + r"(-|s\d+\b)" if prefix else "gdtb"))
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and tag.search(_cmdline(int(d.name))):
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


def known_prefixes() -> set[str]:
    """Every prefix something of ours carries: state files, owner records, namespaces, root links."""
    found = set(state.all_prefixes())
    if state.STATE_DIR.exists():
        found |= {p.name.removesuffix(".owner") for p in state.STATE_DIR.glob("gdtb*.owner")}
    found |= {n.split("-", 1)[0] for n in our_namespaces()}
    found |= {n.split("-", 1)[0] for n in our_root_links() if OURS_RE.match(n)}
    return {p for p in found if PREFIX_RE.match(p)}


def refuse_live(prefix: str) -> None:
    """Raise unless the prefix has no live owner, or this process is it."""
    rec = owner.read(prefix)
    if owner.alive(rec) and not owner.is_mine(rec):
        raise EmuError(f"prefix {prefix} belongs to a live run: {owner.describe(rec)}; stop that run, "  # type: ignore[arg-type]
                       f"or add --force to remove it anyway")


def clean(prefix: str | None = None, force: bool = False, kept: list[str] | None = None) -> list[str]:
    """Remove leftovers of one prefix (or of every testbed prefix); return what was removed. A prefix whose
    owner is another live process is refused (one prefix) or kept and named in `kept` (every prefix),
    unless `force`."""
    if prefix is not None:
        if not force:
            refuse_live(prefix)
        return _clean_one(prefix)
    removed: list[str] = []
    keep: set[str] = set()
    for p in sorted(known_prefixes()):
        rec = owner.read(p)
        if not force and owner.alive(rec) and not owner.is_mine(rec):
            keep.add(p)
            if kept is not None:
                kept.append(f"{p}: in use by {owner.describe(rec)}")  # type: ignore[arg-type]
            continue
        removed += _clean_one(p)
    removed += remove_containers(None, keep=keep)
    for link in our_root_links():  # Mininet's names (gdtb1s0) carry no separator after the prefix
        if not any(root_link_of(link, k) for k in keep):
            run(["ip", "link", "del", link], check=False)
            removed.append(f"link {link}")
    return removed


def _clean_one(prefix: str) -> list[str]:
    removed: list[str] = []
    pids: set[int] = set()
    st = state.load(prefix) or {}
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
        run(["ip", "link", "del", "dev", link], check=False)
        removed.append(f"link {link}")
    if state.load(prefix) is not None or state.state_path(prefix).with_suffix(".tmp").exists():
        removed.append(f"state {prefix}")
    state.forget(prefix)
    if not owner.is_mine(owner.read(prefix)):
        owner.forget(prefix)
    return removed

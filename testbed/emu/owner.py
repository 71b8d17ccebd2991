"""Who owns an emulation prefix: a record `/run/gdtb/<prefix>.owner` (pid, process start time, command).

A run claims its prefix before building anything and gives it back when it ends. `clean` and
`topology down` refuse to remove a prefix whose owner is a live process other than themselves
(unless forced), and a run started without `--prefix` takes the first `gdtb<N>` nobody uses, so it
never removes or joins a run it did not start. The start time (from /proc) tells a live owner from
a recycled pid. A topology left up on purpose (`topology up`, netns) keeps its record after its
owner exits: not live, but still in use, so no default prefix lands on it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from testbed.emu import state
from testbed.emu.names import OURS_RE
from testbed.emu.sh import EmuError, run


def _ours(name: str, prefix: str | None) -> bool:
    return bool(OURS_RE.match(name)) and (prefix is None or name.startswith(prefix + "-"))


def our_namespaces(prefix: str | None = None) -> list[str]:
    """The network namespaces this machine has that carry our prefix (`prefix`'s only, if given)."""
    out = run(["ip", "netns", "list"], check=False)
    return [ln.split()[0] for ln in out.splitlines() if ln.strip() and _ours(ln.split()[0], prefix)]


def owner_path(prefix: str) -> Path:
    return state.STATE_DIR / f"{prefix}.owner"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def me() -> dict:
    pid = os.getpid()
    return {"pid": pid, "start": start_time(pid), "cmd": _cmdline(pid)[:300], "since": time.time()}


def read(prefix: str) -> dict | None:
    try:
        return json.loads(owner_path(prefix).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def alive(rec: dict | None) -> bool:
    return bool(rec) and start_time(int(rec["pid"])) == rec.get("start")  # type: ignore[index]


def is_mine(rec: dict | None) -> bool:
    return bool(rec) and rec["pid"] == os.getpid() and alive(rec)  # type: ignore[index]


def describe(rec: dict) -> str:
    since = time.strftime("%H:%M:%S", time.localtime(rec.get("since", 0)))
    return f"pid {rec['pid']} ({rec.get('cmd') or '?'}), since {since}"


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """One claim at a time on this machine (two runs picking a free prefix must not pick the same one)."""
    state.STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(state.STATE_DIR / ".owners.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write(prefix: str) -> None:
    p = owner_path(prefix)
    tmp = p.with_suffix(".owner.tmp")
    tmp.write_text(json.dumps(me()))
    os.replace(tmp, p)


def claim(prefix: str) -> bool:
    """Make this process the prefix's owner; True if it was not already. Refuses a live owner's prefix."""
    with _lock():
        rec = read(prefix)
        if is_mine(rec):
            return False
        if alive(rec):
            raise EmuError(f"prefix {prefix} is in use by {describe(rec)}; pick another --prefix "  # type: ignore[arg-type]
                           f"(or leave it out: a free one is picked)")
        if state.state_path(prefix).exists():  # left up on purpose, or by a crash: never adopt it silently
            raise EmuError(f"a topology with prefix {prefix} is already up; `testbed topology down --prefix {prefix}` "
                           f"or pick another --prefix")
        _write(prefix)
        return True


def release(prefix: str) -> None:
    """Give the prefix back, if this process owns it."""
    with _lock():
        if is_mine(read(prefix)):
            owner_path(prefix).unlink(missing_ok=True)


def forget(prefix: str) -> None:
    """Remove the record whoever wrote it (`clean`, once it has removed the prefix's leftovers)."""
    owner_path(prefix).unlink(missing_ok=True)
    owner_path(prefix).with_suffix(".owner.tmp").unlink(missing_ok=True)


def in_use(prefix: str, namespaces: set[str] | None = None) -> str:
    """Why the prefix is taken ('' if it is free): a live owner, a record, a state file, namespaces."""
    rec = read(prefix)
    if alive(rec):
        return f"owned by {describe(rec)}"  # type: ignore[arg-type]
    if rec is not None:
        return f"has an owner record of {describe(rec)}, which has exited"
    if state.state_path(prefix).exists() or (state.STATE_DIR / prefix).exists():
        return "has a state file (a topology is up, or a crashed run left it: `testbed clean --prefix`)"
    if namespaces and any(ns.startswith(prefix + "-") for ns in namespaces):
        return "has network namespaces"
    return ""


def pick_free(namespaces: set[str], start: int = 1, limit: int = 9999) -> str:
    """Claim and return the first `gdtb<N>` (N >= start) nobody uses: no owner, record, state or namespace."""
    with _lock():
        for n in range(start, limit + 1):
            p = f"gdtb{n}"
            if not in_use(p, namespaces):
                _write(p)
                return p
    raise EmuError(f"no free prefix among gdtb{start}..gdtb{limit}; `testbed clean` removes leftovers")


@contextlib.contextmanager
def owned(prefix: str | None, namespaces: set[str] | None = None) -> Iterator[str]:
    """Hold a prefix (the given one, or a free one) for the duration of a run; give it back at the end."""
    if prefix is None:
        if namespaces is None:
            namespaces = set(our_namespaces())
        prefix = pick_free(namespaces)
        fresh = True
    else:
        fresh = claim(prefix)
    try:
        yield prefix
    finally:
        if fresh:
            release(prefix)

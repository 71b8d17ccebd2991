"""Who may talk to a run's control sockets. Standard library only: the role images use it.

Every control socket of a run (the orchestrator's, each Atlas sidecar's, the BubbleTea service's) is
mode 0660, group = the run's group, inside the run directory (0750, same group), so only root and that
group reach it. Each server then asks the kernel who connected (SO_PEERCRED: pid, uid, gid, which a
client cannot forge) and refuses anyone but the processes, or the users, the run started.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys

SOCKET_MODE = 0o660
DIR_MODE = 0o750
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_cred(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected Unix socket, as the kernel recorded
    them at connect(). The pid is 0 when that process is outside this process's PID namespace."""
    return _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))


def listen_unix(path: str, gid: int | None, backlog: int = 64) -> socket.socket:
    """A listening Unix socket at `path`, never connectable by others, not even for an instant: it is
    bound under umask 0177 (mode 0600), then given to group `gid` with mode 0660. Where this process may
    not change the group (root in a container without CAP_CHOWN), it stays 0600 and the orchestrator,
    root on the host, calls `grant` once the server reports ready."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    srv = socket.socket(socket.AF_UNIX)
    old = os.umask(0o177)
    try:
        srv.bind(path)
    finally:
        os.umask(old)
    if gid is not None:
        with contextlib.suppress(PermissionError):
            grant(path, gid)
    srv.listen(backlog)
    return srv


def grant(path: str, gid: int) -> None:
    """Give a socket (or a file) to the run's group: group read/write, nobody else."""
    os.chown(path, -1, gid)
    os.chmod(path, SOCKET_MODE)


def refusal(sock: socket.socket, uids: set[int], name: str) -> str | None:
    """None if the peer runs as one of `uids` (root always may: it can do anything here anyway), else the
    log line that says whom the server refused and why."""
    pid, uid, gid = peer_cred(sock)
    if uid == 0 or uid in uids:
        return None
    who = f"pid {pid}" if pid else "a process outside this PID namespace"
    return (f"{name}: refused a connection from {who} (uid {uid}, gid {gid}): not a user this run's processes run "
            f"as ({', '.join(map(str, sorted(uids | {0})))})")


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)

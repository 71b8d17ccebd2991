"""The group a run's control plane belongs to, and its run directory (testbed/runtime/access.py says
what the sockets in it admit).

Container backends: the role images' group, gid 1000, the primary group of the user `gdtb` the
worker and BubbleTea processes run as (no user-namespace remapping, so the ids are the host's too).
Bare namespaces (netns, mininet): every role process runs as root, and the sockets belong to the
host's system group `gdtb`, created on first use (`groupadd --system gdtb`); add a user to it to let
that user's own tools reach the run's sockets (the servers still check who connects).
"""

from __future__ import annotations

import contextlib
import grp
import os
from pathlib import Path

from testbed.emu.backends.base import Backend
from testbed.emu.containers import IMAGE_GID
from testbed.emu.sh import EmuError, run
from testbed.runtime.access import DIR_MODE

GROUP = "gdtb"


def ensure_group(name: str = GROUP) -> int:
    """The gid of the host group `name`, created as a system group if it does not exist yet."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        pass
    with contextlib.suppress(EmuError):  # another run may have created it meanwhile: the lookup decides
        run(["groupadd", "--system", name])
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise EmuError(f"cannot create the system group {name!r} (groupadd); create it by hand and retry") from None


def run_gid(backend: Backend) -> int:
    """The group of a run's control sockets and run directory on this backend."""
    return IMAGE_GID if backend.service_uid is not None else ensure_group()


def worker_uid(backend: Backend) -> int:
    """The uid the backend's workers run as (root on bare namespaces)."""
    return backend.service_uid if backend.service_uid is not None else 0


def secure_dir(path: Path, gid: int, uid: int = 0) -> Path:
    """Owner `uid`, group `gid`, mode 0750: the group may enter and read, nobody else may."""
    os.chown(path, uid, gid)
    os.chmod(path, DIR_MODE)
    return path

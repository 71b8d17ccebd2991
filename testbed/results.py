"""Atomic result files: write to a temp file in the same folder, then rename. Nothing half-written."""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

from testbed.errors import SpecError

FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # a results disk that takes no more: one line, not a traceback


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w") -> Iterator[IO]:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise SpecError("--out", f"cannot write {path}: {e.strerror}", "pick a folder you can write") from None
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; results are for everyone to read
    try:
        with os.fdopen(fd, mode, newline="" if "b" not in mode else None) as f:
            yield f
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno in FULL:
            raise SpecError("--out", f"{e.strerror.lower()} writing {path}: it was not written (files already there "
                            f"are whole)", "free space there or pick another --out") from None
        raise


def write_csv(path: str | Path, header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    with atomic_open(path) as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)


def write_json(path: str | Path, obj: object) -> None:
    with atomic_open(path) as f:
        json.dump(obj, f, separators=(",", ":"), sort_keys=False)


def write_spec(folder: str | Path, spec: dict, argv: Sequence[str]) -> Path:
    """spec.yaml: the experiment as run and the command that ran it, next to its results."""
    import shlex

    import yaml

    path = Path(folder) / "spec.yaml"
    with atomic_open(path) as f:
        f.write(f"# {shlex.join(['testbed', *argv])}\n")
        yaml.safe_dump(spec, f, sort_keys=False, default_flow_style=None, width=110)
    return path


def csv_text(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def fmt(x: float, digits: int = 6) -> str:
    """Fixed-precision float text: byte-identical across runs and platforms."""
    return f"{x:.{digits}f}"

"""Sweep points as Ray tasks: a local Ray, or an existing cluster (`ray start --head` on one machine,
`ray start --address HEAD:6379` on the others).

A local Ray listens on the loopback address only (Ray would otherwise announce the machine's own address, as a
cluster node must) and sends no usage statistics.

Each point is one task; results are collected in submission order, so the CSVs do not depend on which node
finished first. On a cluster this package is shipped with the job (Ray's `py_modules`), so every node runs the
same code as the driver; its dependencies (`pip install` of this project) must be installed on every node.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from testbed.errors import SpecError


def run_on_ray(fn: Callable, args: list, address: str | None, jobs: int | None,
               on_done: Callable[[int, object], None] | None = None) -> list:
    """fn(a) for every a in args as Ray tasks; results in the order of args. `on_done(i, result)` hears of each
    task as it finishes."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not address or address.split(":")[0] in ("127.0.0.1", "localhost"):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray's switch for a loopback-only node
    try:
        import ray
    except ImportError:
        raise SpecError("--engine", "ray is not installed", "pip install 'ray==2.60.0' (or use --engine process)"
                        ) from None
    started = not ray.is_initialized()
    if started:
        opts: dict = {"include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False}
        if address:
            import testbed

            opts["runtime_env"] = {"py_modules": [str(Path(testbed.__file__).parent)]}
        else:
            opts["num_cpus"] = jobs  # None: every CPU of this machine
        try:
            ray.init(address=address or "local", **opts)  # "local": a new Ray, never one found on this machine
        except ConnectionError as e:
            raise SpecError("--address", f"no Ray cluster at {address} ({e})",
                            "start one with `ray start --head`, or leave --address out for a local Ray") from None
    try:
        task = ray.remote(fn)
        refs = [task.remote(a) for a in args]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    if on_done is not None:
                        on_done(index[ref], ray.get(ref))
            return ray.get(refs)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, SpecError):
                raise cause from None
            raise
    finally:
        if started:
            ray.shutdown()

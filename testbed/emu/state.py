"""The record of what an emulated topology created, so `down` and `clean` can remove all of it.

Written before anything is created and updated as the build goes, so even a build killed with
SIGKILL leaves a record (and `clean` also finds our prefix without one).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

STATE_DIR = Path(os.environ.get("GDTB_STATE_DIR", "/run/gdtb"))


def state_path(prefix: str) -> Path:
    return STATE_DIR / f"{prefix}.json"


def run_dir(prefix: str) -> Path:
    d = STATE_DIR / prefix
    d.mkdir(parents=True, exist_ok=True)
    return d


def save(prefix: str, state: dict) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    p = state_path(prefix)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, p)


def load(prefix: str) -> dict | None:
    p = state_path(prefix)
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError:
        return None


def forget(prefix: str) -> None:
    for p in (state_path(prefix), state_path(prefix).with_suffix(".tmp")):
        p.unlink(missing_ok=True)
    shutil.rmtree(STATE_DIR / prefix, ignore_errors=True)


def all_prefixes() -> list[str]:
    if not STATE_DIR.exists():
        return []
    return sorted(p.stem for p in STATE_DIR.glob("gdtb*.json"))

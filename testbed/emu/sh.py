"""Run host commands as argument lists (never through a shell) with one-line errors."""

from __future__ import annotations

import subprocess


class EmuError(RuntimeError):
    """An emulation step failed; the message is one line with the command and its error."""


def run(argv: list[str], *, check: bool = True, timeout: float = 30, input: str | None = None) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
    except FileNotFoundError:
        raise EmuError(f"{argv[0]} not found; run `make sysdeps` as root to install the emulator's packages") from None
    except subprocess.TimeoutExpired:
        raise EmuError(f"{' '.join(argv)}: timed out after {timeout:g} s") from None
    if check and p.returncode != 0:
        msg = (p.stderr or p.stdout).strip().splitlines()
        raise EmuError(f"{' '.join(argv)}: {msg[-1] if msg else f'exit {p.returncode}'}")
    return p.stdout

"""Shared helpers: small hand-built plans with known closed-form answers."""

from __future__ import annotations

from pathlib import Path

from testbed.plan.synthetic import make_plan  # noqa: F401  (re-exported for tests)

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"

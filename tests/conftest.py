"""Shared helpers: small hand-built plans with known closed-form answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.costs import gpu_specs
from testbed.costs.gpus import GPUS
from testbed.plan.synthetic import make_plan  # noqa: F401  (re-exported for tests)

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture
def zoo(monkeypatch):
    """The GPU registries as they were, after the test."""
    monkeypatch.setattr(gpu_specs, "COMPUTE_SPECS", dict(gpu_specs.COMPUTE_SPECS))
    monkeypatch.setattr(gpu_specs, "LIKE", dict(gpu_specs.LIKE))
    saved = dict(GPUS)
    yield
    GPUS.clear()
    GPUS.update(saved)

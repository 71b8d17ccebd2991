"""Calibration files: measured operator constants for a GPU (written by bench/gpu_profile.py), or a
user's own GPU, loaded into the operator model (`costs/gpu_specs.py register_gpu`).

Format (YAML):

    gpus:
      H100:                 # a known GPU recalibrated, or a new name
        gemm_eff: 0.74      # any ComputeSpec field, and the datasheet numbers
        hbm_eff: 0.88
    measured:               # optional: the operator times it was fitted on (for reporting only)
      - {op: gemm, m: 4096, n: 4096, k: 4096, time_s: 0.00021}
"""

from __future__ import annotations

from pathlib import Path

import yaml

from testbed.costs.gpu_specs import register_gpu
from testbed.errors import SpecError


def register_gpus(gpus: object, field: str) -> None:
    if not isinstance(gpus, dict):
        raise SpecError(field, "not a mapping of GPU name to its numbers", "write `NAME: {peak_tflops: ..., ...}`")
    for name, fields in gpus.items():
        if not isinstance(fields, dict):
            raise SpecError(f"{field}.{name}", "not a mapping", "write `peak_tflops: ...` and the like under it")
        register_gpu(str(name), fields)


def load_calibration(path: str | Path) -> dict:
    """Read a calibration file and register its GPUs; returns what it holds."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        why = e.__class__.__name__
        raise SpecError(str(path), f"cannot read calibration: {why}", "check the path and YAML") from None
    if not isinstance(data, dict) or "gpus" not in data:
        raise SpecError(str(path), "no `gpus:` mapping", "write the file bench/gpu_profile.py writes")
    register_gpus(data["gpus"], f"{path}: gpus")
    return data

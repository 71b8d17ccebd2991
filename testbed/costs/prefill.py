"""Prefill (prompt processing) time of an inference model, calibrated on measured prompt times.

  time = overhead_per_layer x layers / tp + matmul FLOPs / (peak x tp x e_mm) + attention FLOPs / (peak x tp x e_attn)

FLOPs come from the model's shape (2 per parameter per token, plus 4 s^2 h per layer for
attention, plus the output head). The three constants per (GPU, TP) are fitted by an L1 fit of
relative error (iteratively reweighted least squares) on the Splitwise measurements
(`shared/data/splitwise-perf-model/perf_model.csv`: llama2-70b and bloom-176b on A100/H100).
`bench/prefill_model_error.py` refits them and prints the error; CALIBRATION below is its output.

Covered: A100 and H100 at TP 4 and 8. Not covered: TP 2 (the data is inconsistent there: batch 64
runs faster than batch 8, likely truncated runs) and power-capped H100s. Other TPs use the nearest
covered TP of the same GPU and the H200 uses the H100's (same compute); `coverage()` says which.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from testbed.costs.gpus import GPUS
from testbed.costs.models import MODELS, ModelConfig
from testbed.errors import SpecError


@dataclass(frozen=True)
class Calibration:
    overhead_per_layer_s: float
    e_mm: float
    e_attn: float


# fitted by bench/prefill_model_error.py --fit on perf_model.csv (A100/H100, TP 4/8)
CALIBRATION: dict[tuple[str, int], Calibration] = {
    ("A100", 4): Calibration(0.00075686, 0.5111, 0.3238),
    ("A100", 8): Calibration(0.00366403, 0.5224, 0.1068),
    ("H100", 4): Calibration(0.000357041, 0.3411, 0.3962),
    ("H100", 8): Calibration(0.00325476, 0.4717, 0.0438),
}
HARDWARE = {"a100-80gb": "A100", "h100-80gb": "H100"}
COVERED_TP = (4, 8)


def flop_terms(model: ModelConfig, tokens: int, batch: int = 1) -> tuple[float, float]:
    """(matmul FLOPs, attention FLOPs) of prefilling `batch` prompts of `tokens` tokens."""
    mm = batch * tokens * 2.0 * (model.layers * (model.layer_params() - 2 * model.hidden)
                                 + model.vocab * model.hidden)
    attn = batch * 4.0 * tokens * tokens * model.hidden * model.layers
    return mm, attn


def coverage(gpu: str, tp: int) -> tuple[tuple[str, int], bool]:
    """The calibration used for (gpu, tp), and whether it was measured (True) or borrowed (False)."""
    g = "H100" if gpu == "H200" else gpu
    t = min(COVERED_TP, key=lambda c: (abs(c - tp), c))
    return (g, t), (g == gpu and t == tp)


def prefill_time_s(model: ModelConfig, gpu: str, tp: int, tokens: int, batch: int = 1) -> float:
    if tokens <= 0:
        return 0.0
    cal = CALIBRATION[coverage(gpu, tp)[0]]
    peak = GPUS[gpu].peak_tflops * 1e12 * tp
    mm, attn = flop_terms(model, tokens, batch)
    return cal.overhead_per_layer_s * model.layers / tp + mm / (peak * cal.e_mm) + attn / (peak * cal.e_attn)


def chunk_time_s(model: ModelConfig, gpu: str, tp: int, done: int, chunk: int) -> float:
    """Prefill of tokens [done, done+chunk) after `done` tokens are already cached (chunked prefill):
    the extra cost over prefilling `done` tokens, plus one more pass's fixed overhead."""
    cal = CALIBRATION[coverage(gpu, tp)[0]]
    extra = prefill_time_s(model, gpu, tp, done + chunk) - prefill_time_s(model, gpu, tp, done)
    return extra + (cal.overhead_per_layer_s * model.layers / tp if done else 0.0)


def kv_bytes_per_token(model: ModelConfig) -> float:
    """K and V of every layer in bf16 (GQA shrinks it by heads/kv_heads)."""
    return 2.0 * model.layers * model.kv_heads * model.head_dim * 2


def weights_gb(model: ModelConfig, tp: int) -> float:
    return model.total_params() * 2 / tp / 1e9


def inference_model(name: str) -> ModelConfig:
    if name not in MODELS:
        raise SpecError("bubbletea.model", f"unknown model {name!r}", f"use one of {', '.join(MODELS)}")
    return MODELS[name]


# --- calibration --------------------------------------------------------------------------------

def load_perf_rows(path: str | Path) -> list[dict]:
    """Rows of a Splitwise-format perf CSV; a bad row fails with its line number."""
    out = []
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        need = {"model", "hardware", "prompt_size", "batch_size", "prompt_time", "tensor_parallel"}
        missing = need - set(r.fieldnames or [])
        if missing:
            raise SpecError(str(path), f"missing columns {sorted(missing)}", "use the Splitwise perf_model.csv format")
        for line, row in enumerate(r, start=2):
            try:
                out.append({"model": row["model"], "hardware": row["hardware"], "prompt": int(row["prompt_size"]),
                            "batch": int(row["batch_size"]), "time_s": float(row["prompt_time"]) / 1e3,
                            "tp": int(row["tensor_parallel"])})
            except (TypeError, ValueError):
                raise SpecError(f"{path}:{line}", "not a number in a numeric column", "fix or remove the row") from None
    return out


def covered_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["hardware"] in HARDWARE and r["tp"] in COVERED_TP and r["model"] in MODELS]


def fit(rows: list[dict]) -> dict[tuple[str, int], Calibration]:
    """L1 fit (IRLS) of relative error per (GPU, TP) over the covered rows."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in covered_rows(rows):
        groups.setdefault((HARDWARE[r["hardware"]], r["tp"]), []).append(r)
    out = {}
    for (gpu, tp), rs in sorted(groups.items()):
        peak = GPUS[gpu].peak_tflops * 1e12 * tp
        t = np.array([r["time_s"] for r in rs])
        feats = []
        for r in rs:
            m = MODELS[r["model"]]
            mm, attn = flop_terms(m, r["prompt"], r["batch"])
            feats.append([m.layers / tp, mm / peak, attn / peak])
        X = np.array(feats) / t[:, None]
        w = np.ones(len(t))
        coef = np.zeros(3)
        for _ in range(200):
            coef, *_ = np.linalg.lstsq(X * w[:, None], w, rcond=None)
            coef = np.maximum(coef, 1e-12)  # physical: no negative overhead or efficiency
            w = 1 / np.sqrt(np.maximum(np.abs(X @ coef - 1), 1e-4))
        out[(gpu, tp)] = Calibration(float(coef[0]), float(1 / coef[1]), float(1 / coef[2]))
    return out


def relative_errors(rows: list[dict], cal: dict[tuple[str, int], Calibration] | None = None) -> list[dict]:
    saved = dict(CALIBRATION)
    if cal is not None:
        CALIBRATION.clear()
        CALIBRATION.update(cal)
    try:
        out = []
        for r in covered_rows(rows):
            gpu = HARDWARE[r["hardware"]]
            pred = prefill_time_s(MODELS[r["model"]], gpu, r["tp"], r["prompt"], r["batch"])
            out.append({**r, "gpu": gpu, "pred_s": pred, "rel_err": abs(pred / r["time_s"] - 1)})
        return out
    finally:
        CALIBRATION.clear()
        CALIBRATION.update(saved)

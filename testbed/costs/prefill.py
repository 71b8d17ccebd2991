"""Prefill (prompt processing) time of an inference model: a per-GPU roofline with a per-layer
overhead, calibrated on measured prompt times.

One forward pass over `tokens` new tokens of `batch` prompts, on each of the tp GPUs of a
tensor-parallel group:

  gpu_s  = max(FLOPs / flop_rate, weight bytes / memory bandwidth) + all-reduce bytes / allreduce_rate
  time   = max(layers x overhead_per_layer, gpu_s)

- FLOPs per GPU: 2 per weight per token (matmuls), causal attention 2 b s^2 h per layer (half of
  Megatron's 4 b s^2 h), the output head for the last token of each prompt; all over tp.
- Weight bytes: the model's bf16 weights over tp, read once per pass (the memory side of the roofline,
  from the GPU's datasheet bandwidth; it binds for small passes of big models on slow memory).
- All-reduce bytes: two ring all-reduces of the activations (tokens x hidden x 2 bytes) per layer,
  of which each GPU moves 2(tp-1)/tp. Passes above LARGE_PASS_TOKENS tokens pay `large_pass_factor`
  times as much: every measured GPU, model and TP slows down per token between 2,048 and 4,096
  tokens in one pass, the more the larger the TP (none at TP 2, +44 % at TP 8 on H100), which points
  at the collectives; we carry it as a step and do not know its cause.
- The overhead per layer is host-side (kernel launches, scheduling); it runs ahead of the GPU, so the
  pass takes whichever is longer.

Fitted per GPU type (flop_rate, allreduce_rate, overhead, large_pass_factor: four numbers) on the
Splitwise measurements (`shared/data/splitwise-perf-model/perf_model.csv`: llama2-70b at TP 2/4/8 and
bloom-176b at TP 8 on A100 and H100), by minimising the mean absolute relative error (Nelder-Mead in
log space). Repeated measurements of one configuration are reduced to their median first, and two
configurations that contradict the rest are dropped (`consistent_rows`). `bench/prefill_model_error.py`
refits, prints the held-out errors (k-fold grouped by configuration, leave-one-model-out) and the
coverage of every model the shipped experiments use; CALIBRATION below is its `--fit` output.

Not covered: power-capped H100s (not a GPU of the zoo). The H200 uses the H100's calibration (same
compute; its own memory bandwidth). Other models (llama2-7b, ...) are predicted from their shapes
only: no measurement backs them; `coverage()` says which.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from testbed.costs.gpus import GPUS
from testbed.costs.models import MODELS, ModelConfig
from testbed.errors import SpecError

LARGE_PASS_TOKENS = 2048


@dataclass(frozen=True)
class Calibration:
    overhead_per_layer_s: float  # host-side time per layer, overlapping the GPU's work
    flop_rate: float  # achieved FLOP/s per GPU on the pass's matmuls and attention
    allreduce_rate: float  # achieved bytes/s per GPU of the tensor-parallel all-reduces
    large_pass_factor: float = 1.0  # all-reduce cost multiplier above LARGE_PASS_TOKENS tokens per pass
    attention_rate: float | None = None  # FLOP/s on attention, where it differs (a CPU); None: flop_rate

    def mfu(self, gpu: str) -> float:
        return self.flop_rate / (GPUS[gpu].peak_tflops * 1e12)


# fitted by `bench/prefill_model_error.py --fit` on perf_model.csv (A100/H100, TP 2/4/8)
CALIBRATION: dict[str, Calibration] = {
    "A100": Calibration(0.000834456, 2.045e+14, 7.45e+10, 1.678),
    "H100": Calibration(0.000648118, 5.693e+14, 1.126e+11, 1.45),
}
HARDWARE = {"a100-80gb": "A100", "h100-80gb": "H100"}  # perf_model.csv names; power-capped H100s are left out


@dataclass(frozen=True)
class PassWork:
    """What one prefill pass asks of each GPU of its TP group."""

    flops: float
    attention_flops: float  # the part of `flops` in attention (scores and weighted sum)
    weight_bytes: float
    allreduce_bytes: float
    tokens: int
    layers: int


def pass_work(model: ModelConfig, tp: int, tokens: int, cached: int = 0, batch: int = 1) -> PassWork:
    """Work per GPU of prefilling `tokens` new tokens of each of `batch` prompts, after `cached` tokens
    of each are already in the KV cache (a later chunk of a chunked prefill)."""
    h, L = model.hidden, model.layers
    n = tokens * batch
    mm = 2.0 * n * L * (model.layer_params() - 2 * h)
    attn = 4.0 * batch * tokens * (cached + tokens / 2) * h * L  # causal: each token attends to those before it
    head = 2.0 * batch * model.vocab * h  # logits of the last token only
    ar = 2 * L * n * h * 2 * 2 * (tp - 1) / tp
    return PassWork((mm + attn + head) / tp, attn / tp, model.total_params() * 2 / tp, ar, n, L)


def pass_time_s(work: PassWork, gpu: str, cal: Calibration) -> float:
    compute = work.flops / cal.flop_rate
    if cal.attention_rate:
        compute += work.attention_flops * (1 / cal.attention_rate - 1 / cal.flop_rate)
    memory = work.weight_bytes / GPUS[gpu].hbm_bytes_per_s if gpu in GPUS else 0.0
    comm = work.allreduce_bytes / cal.allreduce_rate if work.allreduce_bytes else 0.0
    if work.tokens > LARGE_PASS_TOKENS:
        comm *= cal.large_pass_factor
    return max(work.layers * cal.overhead_per_layer_s, max(compute, memory) + comm)


def coverage(gpu: str) -> tuple[str, bool]:
    """The calibration used for `gpu`, and whether it was measured on that GPU (True) or borrowed."""
    g = "H100" if gpu == "H200" else gpu
    return g, g == gpu


def calibration(gpu: str) -> Calibration:
    key = coverage(gpu)[0]
    if key not in CALIBRATION:
        raise SpecError("gpu", f"no prefill calibration for {gpu!r}", f"use one of {', '.join(CALIBRATION)} or H200")
    return CALIBRATION[key]


def prefill_time_s(model: ModelConfig, gpu: str, tp: int, tokens: int, batch: int = 1,
                   cal: Calibration | None = None) -> float:
    if tokens <= 0:
        return 0.0
    return pass_time_s(pass_work(model, tp, tokens, 0, batch), gpu, cal or calibration(gpu))


def chunk_time_s(model: ModelConfig, gpu: str, tp: int, done: int, chunk: int, cal: Calibration | None = None) -> float:
    """Prefill of tokens [done, done+chunk) after `done` tokens are already cached (chunked prefill):
    one more pass, attending to the cached tokens too."""
    if chunk <= 0:
        return 0.0
    return pass_time_s(pass_work(model, tp, chunk, done), gpu, cal or calibration(gpu))


def prefill_flops(model: ModelConfig, tokens: int) -> float:
    """FLOPs of prefilling one prompt (all GPUs together): the useful work of a prefill."""
    return pass_work(model, 1, tokens).flops


def kv_bytes_per_token(model: ModelConfig) -> float:
    """K and V of every layer in bf16 (GQA shrinks it by heads/kv_heads)."""
    return 2.0 * model.layers * model.kv_heads * model.head_dim * 2


def weights_gb(model: ModelConfig, tp: int) -> float:
    return model.total_params() * 2 / tp / 1e9


def inference_model(name: str) -> ModelConfig:
    if name not in MODELS:
        raise SpecError("bubbletea.model", f"unknown model {name!r}", f"use one of {', '.join(MODELS)}")
    return MODELS[name]


def measured(model: str, gpu: str, tp: int) -> bool:
    """Whether perf_model.csv has measurements of this model on this GPU at this TP."""
    return (model, gpu, tp) in {("llama2-70b", g, t) for g in ("A100", "H100") for t in (2, 4, 8)} | {
        ("bloom-176b", "A100", 8), ("bloom-176b", "H100", 8)}


# --- measurements -------------------------------------------------------------------------------

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


def dedupe(rows: list[dict]) -> list[dict]:
    """One row per configuration (model, hardware, TP, prompt, batch): the median of its repeats, with
    `repeats` counting them. perf_model.csv measures each configuration 5 times, prompt 512 x batch 1
    45 times; fitting or scoring the raw rows would weigh that one configuration 9 times."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["hardware"], r["tp"], r["prompt"], r["batch"]), []).append(r["time_s"])
    return [{"model": m, "hardware": hw, "tp": tp, "prompt": p, "batch": b, "time_s": median(ts), "repeats": len(ts)}
            for (m, hw, tp, p, b), ts in sorted(groups.items())]


def consistent_rows(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(kept, dropped): a configuration measured at less than half the time of one with no more tokens
    in either dimension (same model, hardware, TP) is dropped: a pass cannot get twice as fast with more
    work. In perf_model.csv this drops batch 64 at TP 2, 8x faster than batch 32 (a truncated run)."""
    kept, dropped = [], []
    for r in rows:
        same = [q for q in rows if (q["model"], q["hardware"], q["tp"]) == (r["model"], r["hardware"], r["tp"])]
        smaller = [q["time_s"] for q in same if q["prompt"] <= r["prompt"] and q["batch"] <= r["batch"] and q is not r]
        (dropped if smaller and r["time_s"] < 0.5 * max(smaller) else kept).append(r)
    return kept, dropped


def covered_rows(rows: list[dict]) -> list[dict]:
    """Deduplicated, consistent rows of GPUs in the zoo and models in MODELS."""
    rows = [r for r in rows if r["hardware"] in HARDWARE and r["model"] in MODELS]
    return consistent_rows(dedupe(rows) if rows and "repeats" not in rows[0] else rows)[0]


# --- fitting ------------------------------------------------------------------------------------

def _nelder_mead(f: Callable, x0, iters: int = 600):
    """Minimise f from x0 (a plain Nelder-Mead; the objective is piecewise linear, so no gradients)."""
    import numpy as np

    n = len(x0)
    pts = [x0] + [x0 + 0.5 * np.eye(n)[i] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        c = np.mean(pts[:-1], axis=0)
        xr = c + (c - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = c + 2 * (c - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (pts[-1] - c)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[int(np.argmin(vals))]


def fit_calibration(samples: list[tuple[PassWork, float]], gpu: str, attention: bool = False) -> Calibration:
    """The calibration minimising the mean absolute relative error over (pass work, measured seconds),
    from a start read off the samples themselves (the shortest pass per layer, the best FLOP rate), so
    held-out fits owe nothing to the shipped constants. `attention`: fit attention's FLOP rate apart
    (a CPU, where attention runs far below the matmuls' rate; the GPU data cannot tell them apart)."""
    import numpy as np  # fitting only: the cost model itself runs where numpy is absent (the service's image)

    bw = GPUS[gpu].hbm_bytes_per_s if gpu in GPUS else math.inf
    flops, attn, wbytes, ar, tokens, layers, t = (np.array(v, dtype=float) for v in zip(
        *((w.flops, w.attention_flops, w.weight_bytes, w.allreduce_bytes, w.tokens, w.layers, s) for w, s in samples),
        strict=True))
    large = tokens > LARGE_PASS_TOKENS

    def cal(q) -> Calibration:
        e = np.exp(q)
        return Calibration(float(e[0]), float(e[1]), float(e[2]), 1.0 + float(e[3]),
                           float(e[4]) if attention else None)

    def loss(q) -> float:  # pass_time_s, vectorised
        o, fr, arr, extra = np.exp(q[:4])
        compute = flops / fr + (attn * (1 / np.exp(q[4]) - 1 / fr) if attention else 0.0)
        gpu_s = np.maximum(compute, wbytes / bw) + ar / arr * np.where(large, 1 + extra, 1.0)
        err = float(np.mean(np.abs(np.maximum(layers * o, gpu_s) / t - 1)))
        return err if math.isfinite(err) else math.inf

    best = float(np.max(flops / t))
    q = np.log([float(np.min(t / layers)), best, 5e10, 0.5] + ([best] if attention else []))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # the simplex may probe absurd rates
        q = _nelder_mead(loss, _nelder_mead(loss, q))  # a restart escapes a collapsed simplex
    return cal(q)


def row_work(r: dict) -> PassWork:
    return pass_work(MODELS[r["model"]], r["tp"], r["prompt"], 0, r["batch"])


def fit(rows: list[dict]) -> dict[str, Calibration]:
    """Per GPU type, over the covered rows."""
    by: dict[str, list[tuple[PassWork, float]]] = {}
    for r in covered_rows(rows):
        by.setdefault(HARDWARE[r["hardware"]], []).append((row_work(r), r["time_s"]))
    return {g: fit_calibration(samples, g) for g, samples in sorted(by.items())}


def relative_errors(rows: list[dict], cal: dict[str, Calibration] | None = None) -> list[dict]:
    """Each covered row with its prediction under `cal` (default: CALIBRATION) and |pred/measured - 1|."""
    cal = cal or CALIBRATION
    out = []
    for r in covered_rows(rows):
        gpu = HARDWARE[r["hardware"]]
        if gpu not in cal:
            continue
        pred = pass_time_s(row_work(r), gpu, cal[gpu])
        out.append({**r, "gpu": gpu, "pred_s": pred, "rel_err": abs(pred / r["time_s"] - 1)})
    return out


def held_out_errors(rows: list[dict], group: Callable[[dict], object], folds: int | None = None) -> list[dict]:
    """Cross-validated errors: rows are split by `group(row)` into folds (every group in one fold;
    `folds` None = one fold per group); each fold is predicted by a calibration fitted without it."""
    rows = covered_rows(rows)
    keys = sorted({group(r) for r in rows}, key=str)
    fold_of = {k: (i % folds if folds else i) for i, k in enumerate(keys)}
    out = []
    for f in sorted(set(fold_of.values())):
        test = [r for r in rows if fold_of[group(r)] == f]
        cal = fit([r for r in rows if fold_of[group(r)] != f])
        out += relative_errors(test, cal)
    return out


def spread(errs: list[float]) -> tuple[float, float]:
    """(median, p90) of absolute relative errors."""
    s = sorted(errs)
    return median(s), s[min(len(s) - 1, math.ceil(0.9 * len(s)) - 1)]

"""Prefill time from the training's operators: a forward pass at the batch's shape plus the KV cache write.

One pass of `batch` prompts of `tokens` new tokens (after `cached` ones) on each GPU of a TP group is,
per layer, the forward GEMMs at m = batch x tokens, causal FlashAttention, the memory-bound operators,
writing K and V to the cache, and two all-reduces; then the logits of each prompt's last token
(`costs/operators.py`, the same functions training uses). Measured serving stacks add what the
operators do not show; four constants per GPU carry it, fitted on measured prompt times:

  time = max(layers x overhead_per_layer_s, scale x ops_s + comm_factor x comm_s x (large_pass_factor
              when the pass has more than LARGE_PASS_TOKENS tokens))

`scale` and `comm_factor` are 1 for an ideal stack; `large_pass_factor` is the step every measured GPU,
model and TP shows above 2,048 tokens in one pass (see costs/prefill.py).

OPS_CALIBRATION holds the constants fitted on the Splitwise rows (A100, H100). A GPU without rows gets
its own operators (its datasheet and ComputeSpec) with a measured GPU's serving-stack constants:
`coverage()` says whose (a user's GPU: its `like`'s; an A100 variant: the A100's; any other: the H100's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.costs import gpu_specs
from testbed.costs.models import ModelConfig
from testbed.costs.operators import BF16, allreduce_s, attention_s, gemm_s, layer_gemms, memory_bound_bytes, memory_s
from testbed.costs.prefill import LARGE_PASS_TOKENS, _nelder_mead


@dataclass(frozen=True)
class OpsWork:
    """One pass's operator times on the zoo's constants (per GPU of the TP group)."""

    ops_s: float  # GEMMs, attention, memory-bound operators, KV cache write, logits
    comm_s: float  # the all-reduces
    tokens: int
    layers: int


@dataclass(frozen=True)
class OpsCalibration:
    overhead_per_layer_s: float
    scale: float
    comm_factor: float
    large_pass_factor: float


# fitted by `bench/prefill_model_error.py --fit` on perf_model.csv (A100/H100, TP 2/4/8)
OPS_CALIBRATION: dict[str, OpsCalibration] = {
    "A100": OpsCalibration(0.000162192, 1.228, 0.976, 4.53),
    "H100": OpsCalibration(0.000637207, 1.313, 1.141, 2.94),
}


def coverage(gpu: str) -> tuple[str, bool]:
    """The GPU whose serving-stack constants `gpu` uses, and whether they were measured on `gpu` itself."""
    g = gpu
    for _ in range(len(gpu_specs.LIKE) + 2):  # each step follows one `like`; the last one lands on a measured GPU
        if g in OPS_CALIBRATION:
            break
        g = gpu_specs.LIKE.get(g, "A100" if g.startswith("A100") else "H100")
    else:
        g = "H100"  # a cycle of `like`s
    return g, g == gpu


def pass_ops(model: ModelConfig, gpu: str, tp: int, tokens: int, batch: int = 1, cached: int = 0) -> OpsWork:
    n = tokens * batch
    kv_bytes = n * 2 * model.kv_heads * model.head_dim / tp * BF16
    mem_bytes, kernels = memory_bound_bytes(model, n, tp, sequence_parallel=False)
    layer = (sum(gemm_s(m, k_out, k, gpu) for m, k_out, k in layer_gemms(model, n, tp))
             + attention_s(batch, tokens, max(1, model.heads // tp), model.head_dim, gpu, cached=cached)
             + memory_s(mem_bytes + kv_bytes, gpu, kernels + 1))
    head = gemm_s(batch, math.ceil(model.vocab / tp), model.hidden, gpu)
    comm = 2 * allreduce_s(n * model.hidden * BF16, tp, gpu)
    return OpsWork(model.layers * layer + head, model.layers * comm, n, model.layers)


def ops_time_s(w: OpsWork, cal: OpsCalibration) -> float:
    comm = w.comm_s * cal.comm_factor * (cal.large_pass_factor if w.tokens > LARGE_PASS_TOKENS else 1.0)
    return max(w.layers * cal.overhead_per_layer_s, cal.scale * w.ops_s + comm)


def prefill_time_s(model: ModelConfig, gpu: str, tp: int, tokens: int, batch: int = 1,
                   cal: OpsCalibration | None = None) -> float:
    """One pass over `tokens` new tokens of each of `batch` prompts on each GPU of a TP group."""
    if tokens <= 0:
        return 0.0
    return ops_time_s(pass_ops(model, gpu, tp, tokens, batch), cal or OPS_CALIBRATION[coverage(gpu)[0]])


def chunk_time_s(model: ModelConfig, gpu: str, tp: int, done: int, chunk: int,
                 cal: OpsCalibration | None = None) -> float:
    """Prefill of tokens [done, done+chunk) after `done` are cached (chunked prefill): attends to those too."""
    if chunk <= 0:
        return 0.0
    return ops_time_s(pass_ops(model, gpu, tp, chunk, 1, cached=done), cal or OPS_CALIBRATION[coverage(gpu)[0]])


def fit_ops(samples: list[tuple[OpsWork, float]]) -> OpsCalibration:
    """The calibration minimising the mean |relative error| over (work, measured seconds)."""
    import numpy as np

    ops, comm, tokens, layers, t = (np.array(v, dtype=float) for v in zip(
        *((w.ops_s, w.comm_s, w.tokens, w.layers, s) for w, s in samples), strict=True))
    large = tokens > LARGE_PASS_TOKENS

    def loss(q) -> float:
        o, sc, cf, extra = np.exp(q)
        pred = np.maximum(layers * o, sc * ops + comm * cf * np.where(large, 1 + extra, 1.0))
        err = float(np.mean(np.abs(pred / t - 1)))
        return err if math.isfinite(err) else math.inf

    q = np.log([float(np.min(t / layers)), 1.0, 1.0, 0.5])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        q = _nelder_mead(loss, _nelder_mead(loss, q))
    e = np.exp(q)
    return OpsCalibration(float(e[0]), float(e[1]), float(e[2]), 1.0 + float(e[3]))


def row_work(r: dict) -> OpsWork:
    from testbed.costs.models import MODELS
    from testbed.costs.prefill import HARDWARE

    return pass_ops(MODELS[r["model"]], HARDWARE[r["hardware"]], r["tp"], r["prompt"], r["batch"])


def fit_rows(rows: list[dict]) -> dict[str, OpsCalibration]:
    """One calibration per GPU type over covered Splitwise rows (costs/prefill.py covered_rows)."""
    from testbed.costs.prefill import HARDWARE

    by: dict[str, list[tuple[OpsWork, float]]] = {}
    for r in rows:
        by.setdefault(HARDWARE[r["hardware"]], []).append((row_work(r), r["time_s"]))
    return {g: fit_ops(s) for g, s in sorted(by.items())}


def held_out(rows: list[dict], group, folds: int | None = None) -> list[float]:
    """|relative error| of each row predicted by calibrations fitted without its group's fold."""
    from testbed.costs.prefill import HARDWARE

    keys = sorted({group(r) for r in rows}, key=str)
    fold_of = {k: (i % folds if folds else i) for i, k in enumerate(keys)}
    errs = []
    for f in sorted(set(fold_of.values())):
        test = [r for r in rows if fold_of[group(r)] == f]
        cal = fit_rows([r for r in rows if fold_of[group(r)] != f])
        errs += [abs(ops_time_s(row_work(r), cal[HARDWARE[r["hardware"]]]) / r["time_s"] - 1) for r in test
                 if HARDWARE[r["hardware"]] in cal]
    return errs

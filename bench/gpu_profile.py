"""Time the operator model's operators on this machine's GPU (or CPU) and write a calibration file.

Measures, with torch: bf16 GEMMs at square and transformer-layer shapes, causal scaled-dot-product
attention forward and backward at several sequence lengths, and a streaming elementwise kernel (HBM
bandwidth). Fits the operator constants of testbed/costs/gpu_specs.py (gemm_eff, k_half, attn_fwd_eff,
attn_bwd_eff, attn_seq_half, hbm_eff) to the measurements, prints the model's error before and after,
and writes a YAML file that `testbed sim --calibration FILE` (or `costs.calibration`) loads.

A known GPU keeps its datasheet numbers; an unknown device (a CPU, a GPU outside the zoo) gets its peak
from the fastest GEMM measured and its memory bandwidth from the elementwise kernel. NVLink collectives
need two GPUs and are not measured here (the file keeps the zoo's nvlink_eff).
Run: .venv/bin/python bench/gpu_profile.py [--device cuda|cpu] [--name H100] [--quick] [--out FILE]
A full run stays under 8 minutes on a GPU (--budget-s caps it); --quick (tiny shapes) takes seconds on a CPU.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from functools import partial
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from testbed.costs import gpu_specs  # noqa: E402
from testbed.costs.gpus import GPUS  # noqa: E402
from testbed.costs.operators import attention_s, gemm_s, memory_s  # noqa: E402

ZOO_NAMES = {"A100": "A100", "H100 PCIe": "H100-PCIE", "H100": "H100", "H200": "H200", "B200": "B200",
             "MI300X": "MI300X"}


def _timer(torch, device: str, fn, budget_s: float) -> float:
    """Median seconds of `fn()` over a few repeats after a warm-up."""
    fn()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        if sum(times) > budget_s:
            break
    return median(times)


def shapes(quick: bool) -> dict[str, list[tuple[int, ...]]]:
    if quick:
        return {"gemm": [(64, 64, 64), (128, 128, 128), (256, 256, 256), (128, 512, 64), (512, 128, 256)],
                "attention": [(1, 64, 2, 32), (1, 128, 2, 32), (1, 256, 2, 32)], "memory": [(1 << 20,)]}
    sq = [(n, n, n) for n in (1024, 2048, 4096, 8192)]
    layer = [(t, n, k) for t in (2048, 8192) for n, k in ((1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584),
                                                          (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))]
    return {"gemm": sq + layer, "attention": [(b, s, 8, 128) for b, s in ((8, 512), (4, 1024), (2, 2048), (1, 4096),
                                                                          (1, 8192))],
            "memory": [(1 << 28,)]}


def _fwd_bwd(torch, q, k, v) -> None:
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


def measure(torch, device: str, quick: bool, budget_s: float) -> list[dict]:
    """One row per operator and shape: its measured seconds."""
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    rows, start = [], time.perf_counter()
    per = budget_s / 40
    for m, n, k in shapes(quick)["gemm"]:
        a, b = torch.randn(m, k, device=device, dtype=dt), torch.randn(k, n, device=device, dtype=dt)
        rows.append({"op": "gemm", "m": m, "n": n, "k": k, "time_s": _timer(torch, device, partial(torch.matmul, a, b),
                                                                          per)})
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for bsz, s, h, d in shapes(quick)["attention"]:
        q, kk, v = (torch.randn(bsz, h, s, d, device=device, dtype=dt, requires_grad=True) for _ in range(3))
        fwd = _timer(torch, device, partial(sdpa, q, kk, v, is_causal=True), per)
        both = _timer(torch, device, partial(_fwd_bwd, torch, q, kk, v), per)
        rows.append({"op": "attention", "batch": bsz, "seq": s, "heads": h, "head_dim": d, "time_s": fwd,
                     "bwd_time_s": max(both - fwd, 1e-9)})
    for (n,) in shapes(quick)["memory"]:
        x, y = torch.randn(n, device=device, dtype=dt), torch.randn(n, device=device, dtype=dt)
        t = _timer(torch, device, partial(torch.add, x, y), per)
        rows.append({"op": "memory", "bytes": 3 * n * x.element_size(), "time_s": t})
    print(f"measured {len(rows)} operators in {time.perf_counter() - start:.1f} s")
    return rows


def predict(name: str, r: dict) -> tuple[float, ...]:
    if r["op"] == "gemm":
        return (gemm_s(r["m"], r["n"], r["k"], name),)
    if r["op"] == "attention":
        args = (r["batch"], r["seq"], r["heads"], r["head_dim"], name)
        return attention_s(*args), attention_s(*args, backward=True)
    return (memory_s(r["bytes"], name),)


def error(name: str, rows: list[dict]) -> float:
    """Median |log(predicted / measured)| over every measured time."""
    errs = []
    for r in rows:
        meas = (r["time_s"], r["bwd_time_s"]) if r["op"] == "attention" else (r["time_s"],)
        errs += [abs(math.log(p / m)) for p, m in zip(predict(name, r), meas, strict=True)]
    return median(errs)


def fit(name: str, base: dict, rows: list[dict]) -> dict:
    """Grid search over the operator constants (coordinate-wise, twice), each registered and scored."""
    frac = [round(0.001 * 1.25 ** i, 6) for i in range(31)] + [1.0]  # 0.001 .. 0.81, then 1
    grids = {"gemm_eff": frac, "k_half": [0, 16, 32, 64, 128, 256, 512], "attn_fwd_eff": frac, "attn_bwd_eff": frac,
             "attn_seq_half": [0, 64, 256, 512, 1024, 2048], "hbm_eff": frac,
             "launch_s": [0.0] + [round(1e-6 * 2 ** i, 9) for i in range(14)]}
    best = dict(base)
    for _, (key, grid) in itertools.product(range(2), grids.items()):
        scored = []
        for v in [*grid, best[key]]:  # the current value too: a step never makes the fit worse
            gpu_specs.register_gpu(name, {**best, key: v})
            scored.append((error(name, rows), v))
        best[key] = min(scored)[1]
    gpu_specs.register_gpu(name, best)
    return best


def device_numbers(name: str, rows: list[dict]) -> dict:
    """Datasheet numbers: the zoo's for a known GPU; measured ones for anything else."""
    if name in GPUS:
        g = GPUS[name]
        return {"peak_tflops": g.peak_tflops, "memory_gb": g.memory_gb, "hbm_gbps": g.hbm_gbps,
                "nvlink_gbps": g.nvlink_gbps}
    peak = max(2 * r["m"] * r["n"] * r["k"] / r["time_s"] for r in rows if r["op"] == "gemm") / 1e12
    bw = max(r["bytes"] / r["time_s"] for r in rows if r["op"] == "memory") / 1e9
    return {"peak_tflops": round(peak, 6), "memory_gb": 16.0, "hbm_gbps": round(bw, 3), "nvlink_gbps": round(bw, 3),
            "like": "A100", "sms": 1, "tile_m": 64, "tile_n": 64}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if present")
    ap.add_argument("--name", default=None, help="the GPU name to calibrate (default: from the device; CPU: CPU)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a CI check on a CPU; seconds)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="time to spend measuring at most")
    ap.add_argument("--out", type=Path, default=Path("calibration.yaml"))
    a = ap.parse_args(argv)
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    name = a.name or ("CPU" if device == "cpu" else next(
        (z for k, z in ZOO_NAMES.items() if k in torch.cuda.get_device_name()), "GPU"))
    name = name.upper()
    rows = measure(torch, device, a.quick, a.budget_s)
    numbers = device_numbers(name, rows)
    gpu_specs.register_gpu(name, numbers)
    before = error(name, rows)
    spec = gpu_specs.compute_spec(name)
    base = {**numbers, **{k: getattr(spec, k) for k in ("gemm_eff", "k_half", "attn_fwd_eff", "attn_bwd_eff",
                                                        "attn_seq_half", "hbm_eff", "launch_s")}}
    fitted = fit(name, base, rows)
    after = error(name, rows)
    print(f"{name} ({device}): median |log error| of the operator model {before:.3f} with the zoo's constants, "
          f"{after:.3f} calibrated")
    for r in rows:
        r["model_s"] = [round(p, 9) for p in predict(name, r)]
    doc = {"gpus": {name: fitted}, "device": device, "torch": str(torch.__version__),
           "error": {"before": round(before, 4), "after": round(after, 4)}, "measured": rows}
    a.out.write_text(yaml.safe_dump(doc, sort_keys=False))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

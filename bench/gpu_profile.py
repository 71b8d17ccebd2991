"""Time the operator model's operators on this machine's GPU (or CPU) and write a calibration file.

Measures, with torch: bf16 GEMMs at square and transformer-layer shapes, causal scaled-dot-product
attention forward and backward at several sequence lengths, a streaming elementwise kernel (HBM
bandwidth), and whole transformer layers (Llama 3 8B / 70B / 405B and GPT-3 175B shapes at their tp, one GPU
of the group, forward and backward). Fits the operator constants of testbed/costs/gpu_specs.py (gemm_eff,
k_half, attn_fwd_eff, attn_bwd_eff, attn_seq_half, hbm_eff, launch_s) to the operators, prints the model's
error with the zoo's constants and calibrated, on a held-out half of the shapes (fitted on the other half) and
on the whole layers (never fitted on), and writes a YAML file that `testbed sim --calibration FILE` (or
`costs.calibration`) loads.

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
from dataclasses import asdict
from functools import partial
from pathlib import Path
from statistics import fmean, median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from testbed.costs import gpu_specs  # noqa: E402
from testbed.costs.gpus import GPUS  # noqa: E402
from testbed.costs.models import MODELS, ModelConfig  # noqa: E402
from testbed.costs.operators import COMPUTE_OVERHEAD, attention_s, gemm_s, layer_times, memory_s  # noqa: E402
from testbed.results import atomic_open  # noqa: E402

ZOO_NAMES = {"A100": "A100", "H100 PCIe": "H100-PCIE", "H100": "H100", "H200": "H200", "B200": "B200",
             "MI300X": "MI300X"}


HOST_BOUND = 0.9  # a batch whose launches alone took this share of its time timed the host, not the GPU


def _timer(torch, device: str, fn, budget_s: float) -> tuple[float, bool]:
    """Median seconds of one `fn()` over a few repeats after a warm-up, and whether the GPU waited for the host. On
    a GPU each repeat times a batch of calls back to back between two synchronisations (at least about a
    millisecond of work), as a training step streams its kernels: a call timed alone would add the host's launch
    and synchronisation to a microsecond kernel. Where issuing the batch took nearly as long as running it (a
    small attention's autograd, say), the time is the host's: the row is kept but neither fitted nor scored."""
    fn()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    reps = max(1, min(200, math.ceil(1e-3 / max(time.perf_counter() - t0, 1e-9)))) if device == "cuda" else 1
    times, issued = [], []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        t1 = time.perf_counter()
        sync()
        times.append((time.perf_counter() - t0) / reps)
        issued.append((t1 - t0) / reps)
        if sum(times) * reps > budget_s:
            break
    return median(times), device == "cuda" and median(issued) >= HOST_BOUND * median(times)


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
        t, host = _timer(torch, device, partial(torch.matmul, a, b), per)
        rows.append({"op": "gemm", "m": m, "n": n, "k": k, "time_s": t, "host_bound": [host]})
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for bsz, s, h, d in shapes(quick)["attention"]:
        q, kk, v = (torch.randn(bsz, h, s, d, device=device, dtype=dt, requires_grad=True) for _ in range(3))
        (fwd, host_f), (both, host_b) = (_timer(torch, device, partial(sdpa, q, kk, v, is_causal=True), per),
                                         _timer(torch, device, partial(_fwd_bwd, torch, q, kk, v), per))
        rows.append({"op": "attention", "batch": bsz, "seq": s, "heads": h, "head_dim": d, "time_s": fwd,
                     "bwd_time_s": max(both - fwd, 1e-9), "host_bound": [host_f, host_b or host_f]})
    for (n,) in shapes(quick)["memory"]:
        x, y = torch.randn(n, device=device, dtype=dt), torch.randn(n, device=device, dtype=dt)
        t, host = _timer(torch, device, partial(torch.add, x, y), per)
        rows.append({"op": "memory", "bytes": 3 * n * x.element_size(), "time_s": t, "host_bound": [host]})
    print(f"measured {len(rows)} operators in {time.perf_counter() - start:.1f} s")
    return rows


# Whole layers as one GPU of a TP group computes them (the group's collectives left out: one GPU), at Llama 3's and
# GPT-3's shapes and the tp degrees their published runs use. Never fitted on: a held-out check of how the operator
# model composes a layer (costs/operators.py layer_times), beside its operators.
LAYERS = (("llama3-8b", 1, 1), ("llama3-8b", 2, 1), ("llama3-70b", 4, 1), ("llama3-70b", 8, 1),
          ("llama3-405b", 8, 1), ("gpt3-175b", 8, 1), ("gpt3-175b", 8, 2))
QUICK_LAYERS = (ModelConfig("tiny-llama", 1, 256, 4, 2, 512, 1000, 128, True),
                ModelConfig("tiny-gpt", 1, 256, 4, 4, 1024, 1000, 128, False))


def _layer(torch, cfg: ModelConfig, tp: int, microbatch: int, device: str, dt):
    """An input and the forward of one transformer layer on one GPU of a TP group (Megatron's split: QKV and MLP-up
    by columns, attention output and MLP-down by rows), with rotary and SwiGLU where the model is Llama-style,
    LayerNorm and GeLU where GPT-style (no dropout: layer_times is asked without it)."""
    f = torch.nn.functional
    h, d, b, s = cfg.hidden, cfg.head_dim, microbatch, cfg.seq_len
    heads, kv, ffn = max(1, cfg.heads // tp), max(1, cfg.kv_heads // tp), cfg.ffn_hidden // tp

    def weight(i: int, o: int):
        return torch.empty(i, o, device=device, dtype=dt).normal_(std=0.02).requires_grad_()

    wqkv, wo = weight(h, (heads + 2 * kv) * d), weight(heads * d, h)
    wup, wdown = weight(h, (2 if cfg.gated_mlp else 1) * ffn), weight(ffn, h)
    ang = torch.arange(s, device=device)[:, None] * 10000.0 ** (-torch.arange(d // 2, device=device) / (d // 2))
    cos, sin = ang.cos().to(dt), ang.sin().to(dt)

    def norm(t):
        return f.rms_norm(t, (h,)) if cfg.gated_mlp else f.layer_norm(t, (h,))

    def rotary(t):
        t1, t2 = t[..., : d // 2], t[..., d // 2:]
        return torch.cat((t1 * cos - t2 * sin, t1 * sin + t2 * cos), dim=-1)

    def forward(x):
        q, k, v = (norm(x) @ wqkv).view(b, s, heads + 2 * kv, d).transpose(1, 2).split((heads, kv, kv), dim=1)
        if cfg.gated_mlp:
            q, k = rotary(q), rotary(k)
        a = f.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != heads)
        x = x + a.transpose(1, 2).reshape(b * s, heads * d) @ wo
        u = norm(x) @ wup
        if cfg.gated_mlp:
            gate, u = u.chunk(2, dim=-1)
            u = f.silu(gate) * u
        else:
            u = f.gelu(u, approximate="tanh")
        return x + u @ wdown

    return torch.randn(b * s, h, device=device, dtype=dt, requires_grad=True), forward


def measure_layers(torch, device: str, quick: bool, budget_s: float) -> list[dict]:
    """One row per (model, tp, microbatch): a layer's forward and backward seconds, measured."""
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    cases = [(m, 1, 1) for m in QUICK_LAYERS] if quick else [(MODELS[n], tp, mb) for n, tp, mb in LAYERS]
    rows = []
    for cfg, tp, mb in cases:
        x, forward = _layer(torch, cfg, tp, mb, device, dt)
        grad = torch.ones(x.shape, device=device, dtype=dt)
        fwd, host_f = _timer(torch, device, partial(forward, x), budget_s / len(cases) / 2)
        both, host_b = _timer(torch, device, lambda forward=forward, x=x, grad=grad: forward(x).backward(grad),
                              budget_s / len(cases) / 2)
        rows.append({"op": "layer", "model": cfg.name, "tp": tp, "microbatch": mb, "time_s": fwd,
                     "bwd_time_s": max(both - fwd, 1e-9), "host_bound": [host_f, host_b or host_f],
                     "config": asdict(cfg)})
        del x, forward, grad
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def predict_layer(name: str, r: dict) -> tuple[float, float]:
    """The operator model's forward and backward of the row's layer (overhead included, collectives taken out)."""
    lt = layer_times(ModelConfig(**r["config"]), name, tp=r["tp"], microbatch=r["microbatch"], recompute="none",
                     dropout=False)
    comm = lt.parts["comm"]
    return lt.fwd_s - comm, lt.bwd_s - comm


def layer_error(name: str, rows: list[dict]) -> tuple[float, float]:
    """Median |log(predicted / measured)| of whole layers, and the median of measured / the operators' sum
    (the overhead a plain torch layer shows over the operators, where the model charges COMPUTE_OVERHEAD)."""
    errs, ratios = [], []
    for r in rows:
        for p, m, host in zip(predict_layer(name, r), (r["time_s"], r["bwd_time_s"]), r["host_bound"], strict=True):
            if not host:
                errs.append(abs(math.log(p / m)))
                ratios.append(m / (p / COMPUTE_OVERHEAD))
    return (median(errs), median(ratios)) if errs else (math.nan, math.nan)


def predict(name: str, r: dict) -> tuple[float, ...]:
    if r["op"] == "gemm":
        return (gemm_s(r["m"], r["n"], r["k"], name),)
    if r["op"] == "attention":
        args = (r["batch"], r["seq"], r["heads"], r["head_dim"], name)
        return attention_s(*args), attention_s(*args, backward=True)
    return (memory_s(r["bytes"], name),)


def error(name: str, rows: list[dict], stat=median) -> float:
    """Median (or `stat`) |log(predicted / measured)| over every measured time the GPU, not the host, bounded."""
    errs = []
    for r in rows:
        meas = (r["time_s"], r["bwd_time_s"]) if r["op"] == "attention" else (r["time_s"],)
        errs += [abs(math.log(p / m)) for p, m, host in zip(predict(name, r), meas, r["host_bound"], strict=True)
                 if not host]
    return stat(errs) if errs else math.nan


def fit(name: str, base: dict, rows: list[dict]) -> dict:
    """Grid search over the operator constants (coordinate-wise, twice), each registered and scored by the mean
    |log error| (a median leaves most steps tied, and a tie must not move a constant): a step that does not
    lower it keeps the current value, so the fit never makes it worse."""
    frac = sorted({round(0.01 * 1.05 ** i, 6) for i in range(95)} | {1.0})  # 0.01 .. 1 in 5 % steps
    grids = {"gemm_eff": frac, "k_half": [0, 16, 32, 64, 128, 256, 512], "attn_fwd_eff": frac, "attn_bwd_eff": frac,
             "attn_seq_half": [0, 64, 256, 512, 1024, 2048], "hbm_eff": frac,
             "launch_s": [0.0] + [round(1e-6 * 2 ** i, 9) for i in range(14)]}
    best = dict(base)
    for _, (key, grid) in itertools.product(range(2), grids.items()):
        gpu_specs.register_gpu(name, best)
        score = error(name, rows, fmean)
        for v in grid:
            gpu_specs.register_gpu(name, {**best, key: v})
            e = error(name, rows, fmean)
            if e < score:
                score, best[key] = e, v
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
    rows = measure(torch, device, a.quick, a.budget_s * 0.6)
    layers = measure_layers(torch, device, a.quick, a.budget_s * 0.4)
    numbers = device_numbers(name, rows)
    gpu_specs.register_gpu(name, numbers)
    # held out: fit on every other shape of each operator, score the rest; then fit on all of them for the file
    held_rows = [r for op in ("gemm", "attention", "memory") for r in [x for x in rows if x["op"] == op][1::2]]
    fit_rows = [r for r in rows if all(r is not h for h in held_rows)]
    before, (layers_before, overhead) = error(name, rows), layer_error(name, layers)
    mean_before, held_before = error(name, rows, fmean), error(name, held_rows)
    spec = gpu_specs.compute_spec(name)
    base = {**numbers, **{k: getattr(spec, k) for k in ("gemm_eff", "k_half", "attn_fwd_eff", "attn_bwd_eff",
                                                        "attn_seq_half", "hbm_eff", "launch_s")}}
    fit(name, base, fit_rows)
    held = error(name, held_rows)
    fitted = fit(name, base, rows)
    after, (layers_after, overhead_after) = error(name, rows), layer_error(name, layers)
    mean_after = error(name, rows, fmean)
    print(f"{name} ({device}): median |log error| of the operator model {before:.3f} with the zoo's constants, "
          f"{after:.3f} calibrated; on the held-out half of the shapes {held_before:.3f} -> {held:.3f} (fitted on "
          f"the other half); whole layers (never fitted) {layers_before:.3f} -> {layers_after:.3f}, a plain torch "
          f"layer {overhead:.3f}x the operators' sum ({overhead_after:.3f}x calibrated; the model charges "
          f"{COMPUTE_OVERHEAD}x)")
    host = [f"{r['op']} {'x'.join(str(r[k]) for k in ('m', 'n', 'k', 'batch', 'seq', 'model', 'tp') if k in r)}"
            for r in [*rows, *layers] if any(r["host_bound"])]
    print(f"host-bound (neither fitted nor scored): {', '.join(host) if host else 'none'}")
    for r in rows:
        r["model_s"] = [round(x, 9) for x in predict(name, r)]
    for r in layers:
        r["model_s"] = [round(x, 9) for x in predict_layer(name, r)]
        print(f"  {r['model']} tp {r['tp']} microbatch {r['microbatch']}: forward {r['time_s'] * 1e3:.3f} ms "
              f"(model {r['model_s'][0] * 1e3:.3f}), backward {r['bwd_time_s'] * 1e3:.3f} ms "
              f"(model {r['model_s'][1] * 1e3:.3f})")
    doc = {"gpus": {name: fitted}, "device": device, "device_name": torch.cuda.get_device_name() if device == "cuda"
           else "cpu", "torch": str(torch.__version__),
           "error": {"before": round(before, 4), "after": round(after, 4), "mean_before": round(mean_before, 4),
                     "mean_after": round(mean_after, 4), "held_out_before": round(held_before, 4),
                     "held_out_after": round(held, 4), "layers_before": round(layers_before, 4),
                     "layers_after": round(layers_after, 4), "layer_overhead": round(overhead, 4),
                     "layer_overhead_after": round(overhead_after, 4)},
           "measured": rows, "layers": layers}
    with atomic_open(a.out) as f:  # never a half-written calibration
        f.write(yaml.safe_dump(doc, sort_keys=False))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the operator model needs to know about a GPU beyond its datasheet: SMs, GEMM tile, and the
fractions of peak its kernels reach (GEMMs, FlashAttention, HBM streams, NVLink collectives).

The datasheet numbers (peak, memory, HBM and NVLink bandwidth) live in `costs/gpus.py`; sources are
listed in docs/compute.md. The efficiencies here are what the vendor libraries reach on large shapes
(cuBLAS / hipBLASLt GEMMs, FlashAttention-2 on Ampere, FlashAttention-3 / cuDNN on Hopper and later,
NCCL / RCCL bus bandwidth); shape effects (waves, tiles, memory-bound small shapes, short sequences)
are computed by `costs/operators.py` on top. `bench/gpu_profile.py` measures them on a real GPU and
writes a calibration file that replaces them (`costs/calibration.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from testbed.costs.gpus import GPU, GPUS
from testbed.errors import SpecError


@dataclass(frozen=True)
class ComputeSpec:
    """Per-GPU constants of the operator model (every fraction in (0, 1])."""

    sms: int  # streaming multiprocessors (CUs on AMD): the unit of wave quantisation
    tile_m: int  # output tile of the library's large bf16 GEMM kernel
    tile_n: int
    gemm_eff: float  # fraction of dense peak a large, full-wave GEMM sustains
    k_half: int  # reduction length at which a tile's main loop is half of its time (prologue, epilogue)
    attn_fwd_eff: float  # FlashAttention forward, causal, head dim 128, long sequences: fraction of peak
    attn_bwd_eff: float  # the same for its backward
    attn_seq_half: int  # causal sequence length at which attention reaches half of attn_*_eff
    hbm_eff: float  # fraction of HBM bandwidth a streaming elementwise kernel reaches
    nvlink_eff: float  # NCCL bus bandwidth / one-direction NVLink bandwidth inside a node
    collective_latency_s: float  # per ring step of a collective
    launch_s: float  # fixed cost per kernel (launch, tail)


# Hopper and Blackwell: 128x256 warp-specialised tiles; Ampere and CDNA3: 128x128
_AMPERE = ComputeSpec(108, 128, 128, 0.86, 96, 0.70, 0.55, 512, 0.85, 0.80, 6e-6, 4e-6)
_HOPPER = ComputeSpec(132, 128, 256, 0.78, 128, 0.70, 0.52, 1024, 0.85, 0.80, 6e-6, 4e-6)

COMPUTE_SPECS: dict[str, ComputeSpec] = {
    "A100": _AMPERE,
    "A100-40": _AMPERE,
    "H100": _HOPPER,
    "H100-PCIE": replace(_HOPPER, sms=114),
    "H200": _HOPPER,
    "B200": replace(_HOPPER, sms=148, gemm_eff=0.75, attn_fwd_eff=0.65, attn_bwd_eff=0.50),
    "MI300X": ComputeSpec(304, 128, 128, 0.60, 128, 0.45, 0.30, 1024, 0.80, 0.70, 8e-6, 5e-6),
}

# a user's GPU -> the GPU it names as `like` (what it borrows where it has no measurements of its own)
LIKE: dict[str, str] = {}


def compute_spec(gpu: str) -> ComputeSpec:
    if gpu not in COMPUTE_SPECS:
        raise SpecError("gpu", f"no operator model for GPU {gpu!r}",
                        f"use one of {', '.join(COMPUTE_SPECS)} or describe it under costs.gpus")
    return COMPUTE_SPECS[gpu]


def register_gpu(name: str, fields: dict) -> None:
    """Add a user's GPU, or recalibrate a known one (from YAML): datasheet numbers (`peak_tflops`,
    `memory_gb`, `hbm_gbps`, `nvlink_gbps`; a known GPU keeps its own where not given) and any ComputeSpec
    field, the rest taken from the GPU it names as `like` (default: itself if known, else H100)."""
    name = name.upper()
    known = name in GPUS and name in COMPUTE_SPECS
    like = str(fields.get("like", name if known else "H100")).upper()
    if like not in COMPUTE_SPECS:
        raise SpecError(f"costs.gpus.{name}.like", f"unknown GPU {like!r}", f"use one of {', '.join(COMPUTE_SPECS)}")
    need = ("peak_tflops", "memory_gb", "hbm_gbps", "nvlink_gbps")
    base = {k: getattr(GPUS[name], k) for k in need} if name in GPUS else {}
    missing = [k for k in need if k not in fields and k not in base]
    if missing:
        raise SpecError(f"costs.gpus.{name}", f"missing {', '.join(missing)}", "give the datasheet's numbers")
    spec_fields = set(ComputeSpec.__dataclass_fields__)
    unknown = set(fields) - set(need) - spec_fields - {"like"}
    if unknown:
        raise SpecError(f"costs.gpus.{name}", f"unknown keys {sorted(unknown)}",
                        f"use {', '.join(need)}, like, or {', '.join(sorted(spec_fields))}")
    try:
        gpu = GPU(name, *(float(fields.get(k, base.get(k))) for k in need))
        ref = COMPUTE_SPECS[like]
        spec = replace(ref, **{k: type(getattr(ref, k))(v) for k, v in fields.items() if k in spec_fields})
    except (TypeError, ValueError):
        raise SpecError(f"costs.gpus.{name}", "a value is not a number", "write numbers") from None
    zero_ok = {"k_half", "attn_seq_half", "collective_latency_s", "launch_s"}
    bad = [k for k in need if getattr(gpu, k) <= 0] + [k for k in sorted(spec_fields) if getattr(spec, k) < 0 or (
        getattr(spec, k) == 0 and k not in zero_ok)] + [k for k in sorted(spec_fields) if k.endswith("_eff")
                                                        and getattr(spec, k) > 1]
    if bad:
        raise SpecError(f"costs.gpus.{name}.{bad[0]}", "out of range", "counts and rates above 0, fractions in (0, 1]")
    GPUS[name] = gpu
    COMPUTE_SPECS[name] = spec
    if like != name:
        LIKE[name] = like


def describe_gpu(name: str) -> dict:
    """Everything `register_gpu` needs to rebuild `name` as this process has it (for a role process)."""
    g = GPUS[name]
    out = {"peak_tflops": g.peak_tflops, "memory_gb": g.memory_gb, "hbm_gbps": g.hbm_gbps,
           "nvlink_gbps": g.nvlink_gbps, **asdict(compute_spec(name))}
    return out | ({"like": LIKE[name]} if name in LIKE else {})

"""Physical ranges for every quantity a spec holds, so absurd input fails at load time, naming its field.

Each bound says why it is where it is. Numbers must be finite and must not be booleans (YAML reads
`yes` as true, which pydantic would otherwise take as 1). A value outside its range is rejected with
the range and its unit in the message; nothing downstream has to guard against inf, nan or 1e308.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, StringConstraints


def _num(v: Any) -> str:
    if isinstance(v, int) and abs(v) >= 10**15:
        return f"about 1e{len(str(abs(v))) - 1}" if abs(v) < 10**4000 else "a huge number"
    return f"{v:,}" if isinstance(v, int) else f"{v:,g}"


def _no_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise ValueError(f"{v} is not a number; write a number")
    return v


def between(lo: float, hi: float, unit: str, why: str, *, lo_open: bool = False, lo_text: str = ""):
    """A validator keeping a number inside [lo, hi] (or (lo, hi]); the message states the range and why."""
    u = f" {unit}" if unit else ""
    low = f"above {_num(lo)}" if lo_open else f"from {lo_text or _num(lo)}"

    def check(v: float) -> float:
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{v} is not a finite number; use a value {low} to {_num(hi)}{u}")
        if v < lo or (lo_open and v == lo) or v > hi:
            raise ValueError(f"{_num(v)}{u} is out of range; use a value {low} to {_num(hi)}{u} ({why})")
        return v

    return AfterValidator(check)


def real(lo: float, hi: float, unit: str, why: str, *, lo_open: bool = False, lo_text: str = "") -> Any:
    return Annotated[float, BeforeValidator(_no_bool), between(lo, hi, unit, why, lo_open=lo_open, lo_text=lo_text)]


def whole(lo: int, hi: int, unit: str, why: str) -> Any:
    return Annotated[int, BeforeValidator(_no_bool), between(lo, hi, unit, why)]


def _printable(v: str) -> str:
    if not v.isprintable():
        raise ValueError("has a newline or control character; use printable characters only")
    return v


# a free-form label (experiment, topology or custom model name): printed and written to CSV, never a path
LABEL = Annotated[str, StringConstraints(min_length=1, max_length=100), AfterValidator(_printable)]

# --- topology --------------------------------------------------------------------------------------
WAN_GBPS = real(0.001, 100_000, "Gbit/s", "1 Mbit/s to 100 Tbit/s, a fully lit fibre pair")
LATENCY_MS = real(0, 10_000, "ms", "one way; the longest fibre paths on Earth take about 200 ms")
WINDOW_MB = real(4096 / 2**20, 1024, "MiB",
                 "from Linux's 4 KiB minimum tcp_rmem to TCP's largest window, 2^30 bytes with window scaling",
                 lo_text="4 KiB = 0.0039")
TURN_BYTES = real(64, 2**30, "bytes", "what one flow sends per turn of a fair link's round robin: a frame or more",
                  lo_open=False)
DC_GPUS = whole(1, 10_000_000, "GPUs", "free GPUs in one DC")
GPUS_PER_NODE = whole(1, 1024, "GPUs", "GPUs that share one node's NVLink domain")
INTRA_GBPS = real(0.001, 100_000, "Gbit/s", "one GPU's share of the DC fabric")
INTRA_LATENCY_US = real(0, 1_000_000, "us", "a DC fabric's latency, below one second")
# --- workload --------------------------------------------------------------------------------------
SEQ_LEN = whole(1, 10_000_000, "tokens", "context length")
SEQUENCES = whole(1, 10_000_000, "sequences", "per iteration; today's largest jobs use a few thousand")
TP = whole(1, 1024, "GPUs", "a TP group lives inside one node")
PP = whole(1, 100_000, "stages", "at most one stage per layer")
VIRTUAL_STAGES = whole(1, 1024, "model chunks per stage", "at most one chunk per layer")
DDP_BUCKET_PARAMS = whole(1, 10**12, "parameters", "per gradient bucket; Megatron-Core's default is 40M or more")
DP = whole(1, 10_000_000, "replicas", "data-parallel replicas")
MFU = real(0, 1, "", "a fraction of the GPU's peak", lo_open=True)
LAYERS = whole(1, 100_000, "layers", "transformer layers")
WIDTH = whole(1, 10_000_000, "", "hidden or FFN width")
HEADS = whole(1, 1_000_000, "heads", "attention heads")
VOCAB = whole(1, 100_000_000, "tokens", "vocabulary size")
INNER_STEPS = whole(1, 1_000_000, "steps", "inner steps between syncs; DiLoCo's paper uses 500")
FRAGMENTS = whole(1, 100_000, "fragments", "parts of the model synced in turn")
OUTER_BITS = whole(1, 32, "bits", "per outer-gradient value; Streaming DiLoCo sends 4, fp32 is 32")
OVERLAP_STEPS = whole(0, 1_000_000, "steps", "inner steps a fragment's sync may overlap")
EFFICIENCY = real(0, 10, "", "tokens synchronous training needs / tokens this one needs, for the same loss",
                  lo_open=True)
# --- experiment ------------------------------------------------------------------------------------
RATE_SCALE = real(0, 10_000, "x", "trace time compression; 10,000x the Azure trace is 55,000 requests/s", lo_open=True)
TRACE_START_S = real(0, 1e9, "s", "an offset into the trace")
GUARD_MS = real(0, 60_000, "ms", "the guard band kept free at each end of a bubble")
TTFT_SLO_MS = real(0, 3_600_000, "ms", "time-to-first-token objective, at most an hour", lo_open=True)
SCALE = real(0, 1e12, "", "0 = auto; emulation.scale is checked against the topology before anything is built")
LR = real(0, 10, "", "AdamW learning rate", lo_open=True)
SEED = whole(-(2**63), 2**63 - 1, "", "a 64-bit random seed")
REPLICAS = whole(1, 10_000_000, "replicas", "replicas whose timeline is kept")

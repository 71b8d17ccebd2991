"""GPU zoo: dense bf16 peak and memory, from the vendors' datasheets."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    name: str
    peak_tflops: float  # dense bf16 tensor-core peak
    memory_gb: float


GPUS: dict[str, GPU] = {
    "A100": GPU("A100", 312.0, 80.0),  # A100 SXM4 80GB datasheet
    "H100": GPU("H100", 989.0, 80.0),  # H100 SXM5 datasheet (dense, no sparsity)
    "H200": GPU("H200", 989.0, 141.0),  # H200 SXM datasheet: H100 compute, 141 GB HBM3e
}


def tp_efficiency(tp: int) -> float:
    """Share of peak kept under tensor parallelism (NVLink all-reduces per layer); 1.0 at tp=1."""
    if tp <= 1:
        return 1.0
    if tp <= 8:
        return 0.9
    return 0.75  # TP beyond one NVLink domain crosses the node fabric

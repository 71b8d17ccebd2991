"""GPU zoo: dense bf16 peak, memory, HBM and NVLink bandwidth, from the vendors' datasheets.

Sources (SXM parts, as in HGX/DGX nodes):
- A100: NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): 312 TFLOPS bf16 dense, 2,039 GB/s HBM2e,
  NVLink 600 GB/s (third generation, 12 links).
- H100: NVIDIA H100 Tensor Core GPU datasheet (SXM): 989 TFLOPS bf16 dense, 3.35 TB/s HBM3,
  NVLink 900 GB/s (fourth generation, 18 links).
- H200: NVIDIA H200 Tensor Core GPU datasheet (SXM): H100 compute, 141 GB HBM3e at 4.8 TB/s,
  NVLink 900 GB/s.
The datasheets' NVLink figure counts both directions together; a ring collective sends at half of it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    name: str
    peak_tflops: float  # dense bf16 tensor-core peak
    memory_gb: float
    hbm_gbps: float  # HBM bandwidth, GB/s
    nvlink_gbps: float  # NVLink bandwidth per GPU, GB/s, both directions together (the datasheet figure)

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gbps * 1e9

    @property
    def nvlink_bytes_per_s(self) -> float:
        """What one GPU sends per second over NVLink (one direction)."""
        return self.nvlink_gbps / 2 * 1e9


GPUS: dict[str, GPU] = {
    "A100": GPU("A100", 312.0, 80.0, 2039.0, 600.0),
    "H100": GPU("H100", 989.0, 80.0, 3350.0, 900.0),
    "H200": GPU("H200", 989.0, 141.0, 4800.0, 900.0),
}

"""GPU zoo: dense bf16 peak, memory, HBM and NVLink bandwidth, from the vendors' datasheets.

Sources (SXM parts, as in HGX/DGX nodes):
- A100: NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): 312 TFLOPS bf16 dense, 2,039 GB/s HBM2e,
  NVLink 600 GB/s (third generation, 12 links).
- H100: NVIDIA H100 Tensor Core GPU datasheet (SXM): 989 TFLOPS bf16 dense, 3.35 TB/s HBM3,
  NVLink 900 GB/s (fourth generation, 18 links).
- H200: NVIDIA H200 Tensor Core GPU datasheet (SXM): H100 compute, 141 GB HBM3e at 4.8 TB/s,
  NVLink 900 GB/s.
- A100 40GB: the same datasheet's 40GB SXM column: 312 TFLOPS, 1,555 GB/s HBM2, NVLink 600 GB/s.
- H100 PCIe: the H100 datasheet's PCIe column: 756 TFLOPS bf16 dense (1,513 with sparsity), 80 GB HBM2e at
  2 TB/s, NVLink bridge 600 GB/s.
- B200: NVIDIA HGX B200 datasheet, per GPU: 2.25 PFLOPS bf16 dense (4.5 with sparsity), 180 GB HBM3e at
  7.7 TB/s, NVLink 1.8 TB/s (fifth generation).
- MI300X: AMD Instinct MI300X data sheet: 1,307.4 TFLOPS bf16 dense, 192 GB HBM3 at 5.3 TB/s, Infinity
  Fabric 896 GB/s (7 links of 128 GB/s, both directions).
The datasheets' NVLink figure counts both directions together; a ring collective sends at half of it.
A user's GPU is added from YAML (`costs.gpus`, `costs/gpu_specs.py register_gpu`).
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
    "A100-40": GPU("A100-40", 312.0, 40.0, 1555.0, 600.0),
    "H100-PCIE": GPU("H100-PCIE", 756.0, 80.0, 2000.0, 600.0),
    "B200": GPU("B200", 2250.0, 180.0, 7700.0, 1800.0),
    "MI300X": GPU("MI300X", 1307.4, 192.0, 5300.0, 896.0),
}

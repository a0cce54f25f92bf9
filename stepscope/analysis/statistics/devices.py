"""Peak dense throughput and memory bandwidth of the GPUs a trace names (Kineto's deviceProperties).

Figures are the vendors' datasheet numbers without structured sparsity. "fp32" is the rate an
fp32 GEMM reaches by default: CUDA cores on NVIDIA (PyTorch leaves TF32 off for matmuls), matrix
cores on AMD (hipBLAS uses them for fp32). bf16/fp16/fp8/tf32 are tensor (matrix) core rates.
Sources, one per line of the table:
- V100: NVIDIA Tesla V100 GPU datasheet (SXM2 15.7 FP32 / 125 tensor TFLOPS, PCIe 14 / 112, 900 GB/s);
  V100S PCIe datasheet (16.4 / 130, 1,134 GB/s).
- A100: NVIDIA A100 Tensor Core GPU datasheet (19.5 FP32, 156 TF32, 312 BF16/FP16; 1,555 GB/s 40 GB,
  2,039 GB/s 80 GB SXM, 1,935 GB/s 80 GB PCIe).
- A10: NVIDIA A10 datasheet (31.2 FP32, 62.5 TF32, 125 BF16; 600 GB/s).
- L4: NVIDIA L4 datasheet (30.3 FP32, 60 TF32, 121 BF16, 242.5 FP8 dense; 300 GB/s).
- L40S: NVIDIA L40S datasheet (91.6 FP32, 183 TF32, 362 BF16, 733 FP8 dense; 864 GB/s).
- H100: NVIDIA H100 Tensor Core GPU datasheet (SXM 67 FP32, 494.7 TF32, 989.4 BF16, 1,978.9 FP8,
  3.35 TB/s; PCIe 51 / 378 / 756 / 1,513, 2.0 TB/s; NVL 60 / 417.5 / 835.5 / 1,670.5, 3.9 TB/s).
- H800: NVIDIA H800 SXM5 product brief (the H100 SXM's tensor rates and 3.35 TB/s; less FP64, NVLink).
- H200: NVIDIA H200 Tensor Core GPU datasheet (the H100 SXM's rates, 4.8 TB/s).
- H20: NVIDIA H20 product brief (44 FP32, 74 TF32, 148 BF16, 296 FP8; 4.0 TB/s).
- B200: NVIDIA HGX B200 datasheet, per GPU (75 FP32, 1,100 TF32, 2,250 BF16, 4,500 FP8 dense; 8 TB/s).
- GB200: NVIDIA GB200 NVL72 datasheet, per GPU (80 FP32, 1,250 TF32, 2,500 BF16, 5,000 FP8 dense; 8 TB/s).
- MI100: AMD Instinct MI100 datasheet (46.1 FP32 matrix, 92.3 BF16, 184.6 FP16; 1.23 TB/s).
- MI210: AMD Instinct MI210 datasheet (45.3 FP32 matrix, 181 BF16/FP16; 1.6 TB/s).
- MI250 / MI250X: AMD Instinct MI250 / MI250X datasheets (90.5 / 95.7 FP32 matrix, 362.1 / 383 BF16,
  3.2 TB/s per module). PyTorch sees each of a module's two dies (GCDs) as one device: half of each.
- MI300X: AMD Instinct MI300X datasheet (163.4 FP32 matrix, 653.7 TF32, 1,307.4 BF16/FP16,
  2,614.9 FP8; 5.3 TB/s). MI300A: its datasheet (122.6 / 490.3 / 980.6 / 1,961.2; 5.3 TB/s).
  MI325X: its datasheet (the MI300X's rates, 6 TB/s).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class DevicePeak:
    name: str
    tflops: dict[str, float]  # dtype class (fp32, tf32, bf16, fp16, fp8) -> dense TFLOP/s
    tbs: float  # memory bandwidth, TB/s


def _peak(name: str, tbs: float, fp32: float, bf16: float, fp8: float = 0.0, tf32: float = 0.0, fp16: float = 0.0) -> DevicePeak:
    rates = {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": fp16 or bf16, "fp8": fp8}
    return DevicePeak(name, {k: v for k, v in rates.items() if v > 0}, tbs)


# (pattern on deviceProperties' name, least memory in GiB or 0, compute units or 0, peak), first match wins.
_TABLE: tuple[tuple[str, int, int, DevicePeak], ...] = (
    (r"V100S", 0, 0, _peak("V100S PCIe", 1.134, 16.4, 0, fp16=130)),
    (r"V100.*PCIE", 0, 0, _peak("V100 PCIe", 0.9, 14, 0, fp16=112)),
    (r"V100", 0, 0, _peak("V100 SXM2", 0.9, 15.7, 0, fp16=125)),
    (r"A100.*PCIE", 60, 0, _peak("A100 PCIe 80GB", 1.935, 19.5, 312, tf32=156)),
    (r"A100", 60, 0, _peak("A100 SXM 80GB", 2.039, 19.5, 312, tf32=156)),
    (r"A100", 0, 0, _peak("A100 40GB", 1.555, 19.5, 312, tf32=156)),
    (r"\bA10\b", 0, 0, _peak("A10", 0.6, 31.2, 125, tf32=62.5)),
    (r"\bL4\b", 0, 0, _peak("L4", 0.3, 30.3, 121, fp8=242.5, tf32=60)),
    (r"L40S", 0, 0, _peak("L40S", 0.864, 91.6, 362, fp8=733, tf32=183)),
    (r"H100.*PCIE", 0, 0, _peak("H100 PCIe", 2.0, 51, 756, fp8=1513, tf32=378)),
    (r"H100 NVL", 0, 0, _peak("H100 NVL", 3.9, 60, 835.5, fp8=1670.5, tf32=417.5)),
    (r"H100", 0, 0, _peak("H100 SXM", 3.35, 67, 989.4, fp8=1978.9, tf32=494.7)),
    (r"H800", 0, 0, _peak("H800 SXM", 3.35, 67, 989.4, fp8=1978.9, tf32=494.7)),
    (r"H200", 0, 0, _peak("H200 SXM", 4.8, 67, 989.4, fp8=1978.9, tf32=494.7)),
    (r"\bH20\b", 0, 0, _peak("H20", 4.0, 44, 148, fp8=296, tf32=74)),
    (r"GB200", 0, 0, _peak("GB200 (per GPU)", 8.0, 80, 2500, fp8=5000, tf32=1250)),
    (r"B200", 0, 0, _peak("B200", 8.0, 75, 2250, fp8=4500, tf32=1100)),
    (r"MI100", 0, 0, _peak("MI100", 1.2288, 46.1, 92.3, fp16=184.6)),
    (r"MI210", 0, 0, _peak("MI210", 1.6384, 45.3, 181)),
    (r"MI250X", 0, 0, _peak("MI250X (one GCD)", 1.6384, 47.85, 191.5)),
    (r"MI250", 0, 0, _peak("MI250 (one GCD)", 1.6384, 45.25, 181.05)),
    # ROCm names some MI250 systems' dies "AMD Radeon Graphics": an MI250X die has 110 CUs, an MI250's 104.
    (r"Radeon Graphics", 0, 110, _peak("MI250X (one GCD)", 1.6384, 47.85, 191.5)),
    (r"Radeon Graphics", 0, 104, _peak("MI250 (one GCD)", 1.6384, 45.25, 181.05)),
    (r"MI300A", 0, 0, _peak("MI300A", 5.3, 122.6, 980.6, fp8=1961.2, tf32=490.3)),
    (r"MI325X", 0, 0, _peak("MI325X", 6.0, 163.4, 1307.4, fp8=2614.9, tf32=653.7)),
    (r"MI300X", 0, 0, _peak("MI300X", 5.3, 163.4, 1307.4, fp8=2614.9, tf32=653.7)),
)
_COMPILED = tuple((re.compile(p, re.IGNORECASE), gib, units, peak) for p, gib, units, peak in _TABLE)


def device_peak(name: str, units: int = 0, memory_bytes: int = 0) -> DevicePeak | None:
    """The peak of the device deviceProperties calls `name` (with its numSms and totalGlobalMem,
    which tell variants of one name apart); None for a device not in the table."""
    for pattern, gib, need_units, peak in _COMPILED:
        if pattern.search(name) and memory_bytes >= gib << 30 and need_units in (0, units):
            return peak
    return None

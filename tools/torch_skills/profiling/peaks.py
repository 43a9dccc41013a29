"""Datasheet peak FLOP/s of common NVIDIA GPUs, for model FLOP utilization (MFU).

Use `peak_flops("NVIDIA H100 80GB HBM3", "bf16")` -> `PeakFlops(flops_per_s=9.895e14, ...)` or
None when the GPU or the dtype is not in the table. `dtype` is one of "fp32" (CUDA cores),
"tf32", "bf16", "fp16" (tensor cores). Every figure is the vendor's DENSE peak: datasheets print
the 2:4-sparsity figure first ("1,979 TFLOPS*"), and dense is half of it.

Known limitations: boost-clock peaks; a card running at a lower clock or power cap never reaches
them, so MFU is a lower bound on how well the kernels use the hardware. Only the table's GPUs
get an MFU; every other device still gets the measured `attainable_flops_per_s`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PeakDType = Literal["fp32", "tf32", "bf16", "fp16"]
T = 1e12


@dataclass(frozen=True)
class GpuPeaks:
    name: str
    match: tuple[str, ...]  # every substring must appear in torch.cuda.get_device_name() (lower case)
    flops: dict[str, float]  # dtype -> dense FLOP/s
    source: str
    approximate: bool = False


# Order matters: the first entry whose substrings all match wins (H100 NVL before plain H100).
GPU_PEAKS: tuple[GpuPeaks, ...] = (
    # NVIDIA H100 Tensor Core GPU datasheet: FP32 67 TF; TF32 989 TF, BF16/FP16 1,979 TF with sparsity.
    GpuPeaks("H100 NVL", ("h100", "nvl"), {"fp32": 60 * T, "tf32": 835 / 2 * T, "bf16": 1671 / 2 * T,
             "fp16": 1671 / 2 * T}, "NVIDIA H100 datasheet, H100 NVL column, dense = sparse / 2"),
    GpuPeaks("H100 PCIe", ("h100", "pcie"), {"fp32": 51 * T, "tf32": 756 / 2 * T, "bf16": 1513 / 2 * T,
             "fp16": 1513 / 2 * T}, "NVIDIA H100 datasheet, H100 PCIe column, dense = sparse / 2"),
    GpuPeaks("H100 SXM", ("h100",), {"fp32": 67 * T, "tf32": 989 / 2 * T, "bf16": 1979 / 2 * T,
             "fp16": 1979 / 2 * T}, "NVIDIA H100 datasheet, H100 SXM column, dense = sparse / 2"),
    # NVIDIA H200 Tensor Core GPU datasheet: same compute as H100 SXM, more and faster memory.
    GpuPeaks("H200 NVL", ("h200", "nvl"), {"fp32": 60 * T, "tf32": 835 / 2 * T, "bf16": 1671 / 2 * T,
             "fp16": 1671 / 2 * T}, "NVIDIA H200 datasheet, H200 NVL column, dense = sparse / 2"),
    GpuPeaks("H200 SXM", ("h200",), {"fp32": 67 * T, "tf32": 989 / 2 * T, "bf16": 1979 / 2 * T,
             "fp16": 1979 / 2 * T}, "NVIDIA H200 datasheet, H200 SXM column, dense = sparse / 2"),
    # NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5 TF, TF32 156 TF, BF16/FP16 312 TF (dense),
    # the same for the SXM4 and PCIe, 40 GB and 80 GB boards.
    GpuPeaks("A100", ("a100",), {"fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T},
             "NVIDIA A100 datasheet (dense tensor core figures)"),
    # NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3 TF; TF32 120 TF, BF16/FP16 242 TF with sparsity.
    GpuPeaks("L4", ("l4",), {"fp32": 30.3 * T, "tf32": 60 * T, "bf16": 121 * T, "fp16": 121 * T},
             "NVIDIA L4 datasheet, dense = sparse / 2"),
    # NVIDIA publishes no A10G datasheet (an AWS variant of the GA102-based A10); the A10 figures below
    # are used and the result says so.
    GpuPeaks("A10G", ("a10g",), {"fp32": 31.2 * T, "tf32": 62.5 * T, "bf16": 125 * T, "fp16": 125 * T},
             "NVIDIA A10 datasheet figures (no A10G datasheet exists): approximate", approximate=True),
    # NVIDIA A10 Tensor Core GPU datasheet: FP32 31.2 TF, TF32 62.5 TF, BF16/FP16 125 TF (dense).
    GpuPeaks("A10", ("a10",), {"fp32": 31.2 * T, "tf32": 62.5 * T, "bf16": 125 * T, "fp16": 125 * T},
             "NVIDIA A10 datasheet (dense tensor core figures)"),
    # NVIDIA Ada Lovelace architecture whitepaper, appendix table for the GeForce RTX 4090:
    # FP32 82.6 TF; tensor TF32 82.6, BF16 and FP16 with FP32 accumulate 165.2 TF (dense).
    GpuPeaks("RTX 4090", ("4090",), {"fp32": 82.6 * T, "tf32": 82.6 * T, "bf16": 165.2 * T,
             "fp16": 165.2 * T}, "NVIDIA Ada Lovelace whitepaper (FP32 accumulate, dense)"),
    # NVIDIA V100 Tensor Core GPU datasheet: SXM2 FP32 15.7 TF, FP16 tensor 125 TF; PCIe 14 and 112.
    # Volta has no TF32 and no BF16 tensor cores.
    GpuPeaks("V100 PCIe", ("v100", "pcie"), {"fp32": 14 * T, "fp16": 112 * T},
             "NVIDIA V100 datasheet, PCIe column"),
    GpuPeaks("V100 SXM2", ("v100",), {"fp32": 15.7 * T, "fp16": 125 * T}, "NVIDIA V100 datasheet, SXM2 column"),
    # NVIDIA T4 datasheet: FP32 8.1 TF, FP16 (mixed precision) 65 TF.
    GpuPeaks("T4", ("t4",), {"fp32": 8.1 * T, "fp16": 65 * T}, "NVIDIA T4 datasheet"),
)  # fmt: skip


@dataclass(frozen=True)
class PeakFlops:
    gpu: str
    dtype: PeakDType
    flops_per_s: float
    source: str


def find_gpu(device_name: str) -> GpuPeaks | None:
    """The table entry for a `torch.cuda.get_device_name()` string, or None."""
    lowered = device_name.lower()
    for entry in GPU_PEAKS:
        if all(_has_token(lowered, part) for part in entry.match):
            return entry
    return None


def _has_token(name: str, part: str) -> bool:
    """Substring match that keeps 'l4' from matching inside 'l40s' and 'a10' inside 'a100'."""
    start = name.find(part)
    while start != -1:
        end = start + len(part)
        if end == len(name) or not name[end].isalnum() or part in ("pcie", "nvl"):
            return True
        start = name.find(part, start + 1)
    return False


def peak_flops(device_name: str, dtype: PeakDType) -> PeakFlops | None:
    """Datasheet dense peak for this GPU and dtype, or None when unknown."""
    entry = find_gpu(device_name)
    if entry is None or dtype not in entry.flops:
        return None
    return PeakFlops(entry.name, dtype, entry.flops[dtype], entry.source)

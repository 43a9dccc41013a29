"""CUDA memory that no tensor of the model accounts for: the context and the cuBLAS workspaces.

Use:

    cuda_context_bytes()                                 # stated constant, added to reserved memory
    cublas_workspace_bytes(hopper=False, handles=2)      # counted in memory_allocated()
    uses_cublas(trace.events)                            # did the step run a matmul?

Facts, from pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp (read for this tool at
commit 26a39059): each (cuBLAS handle, stream) pair gets a workspace from the caching
allocator on first use, sized by CUBLAS_WORKSPACE_CONFIG, default ":4096:2:16:8" = 4096 KiB x 2
+ 16 KiB x 8 = 8.125 MiB, or 32 MiB on sm90 (Hopper). Handles are per thread: the forward runs
on the Python thread and the backward on the autograd engine's device thread, so a training step
holds two workspaces and inference one. They stay allocated for the life of the process.

The CUDA context (driver state, kernel images) is not allocated through PyTorch and shows up in
nvidia-smi, not in memory_reserved(): typically 300-600 MiB with CUDA 12 lazy module loading,
depending on GPU and driver. CUDA_CONTEXT_BYTES is a stated middle value, not a measurement.
"""

from __future__ import annotations

CUDA_CONTEXT_BYTES = 512 * 2**20  # typical CUDA 12 context with lazy loading: 300-600 MiB by GPU/driver
CUBLAS_WORKSPACE_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8  # ":4096:2:16:8", every GPU but sm90
CUBLAS_WORKSPACE_SM90 = 4096 * 8 * 1024  # 32 MiB default on Hopper (sm90)

MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "_scaled_mm"})


def cuda_context_bytes() -> int:
    return CUDA_CONTEXT_BYTES


def cublas_workspace_bytes(*, hopper: bool, handles: int) -> int:
    """Bytes of cuBLAS workspace held by `handles` (thread, stream) pairs."""
    return handles * (CUBLAS_WORKSPACE_SM90 if hopper else CUBLAS_WORKSPACE_DEFAULT)


def uses_cublas(events: list) -> bool:
    """Whether any op in the trace is a cuBLAS matmul."""
    return any(tag == "op" and value.op in MATMUL_OPS for tag, value in events)


def local_gpu_is_hopper() -> bool | None:
    """True/False for the local GPU, None when there is none."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()[0] == 9

"""CUDA memory that no tensor of the model accounts for: the context and the cuBLAS workspaces.

Use:

    cuda_context_bytes()                                 # stated constant, added to reserved memory
    cublas_workspace_bytes(hopper=False, handles=2)      # counted in memory_allocated()
    uses_cublas(trace.events)                            # did the step run a matmul?
    cublaslt_threads(trace.events)                       # threads that ran a biased matmul (cuBLASLt)

Facts, from pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp (read for this tool at
commit 26a39059): each (cuBLAS handle, stream) pair gets a workspace from the caching
allocator on first use, sized by CUBLAS_WORKSPACE_CONFIG, default ":4096:2:16:8" = 4096 KiB x 2
+ 16 KiB x 8 = 8.125 MiB, or 32 MiB on sm90 (Hopper). Handles are per thread: the forward runs
on the Python thread and the backward on the autograd engine's device thread, so a training step
holds two workspaces and inference one. They stay allocated for the life of the process.

A matmul with a bias (`addmm`, what nn.Linear runs) goes through cuBLASLt, whose handle gets a
workspace of its own (CUBLASLT_WORKSPACE_SIZE, default 1024 KiB), once per thread that runs one.
Measured on an H100 (torch 2.11+cu130, bench/gpu/results/peakdiff.json): the requested bytes of a
real step exceed the trace by the cuBLAS workspaces plus 1 MiB when only the forward thread runs
`addmm` (ViT, BERT, nn.TransformerEncoder), plus 2 MiB when activation checkpointing reruns the
forward on the backward thread (GPT with GPTBlock checkpointed); Llama-style models, whose Linears
have no bias, show none.

The CUDA context (driver state, kernel images) is not allocated through PyTorch and shows up in
nvidia-smi, not in memory_reserved(). CUDA_CONTEXT_BYTES is the figure measured on an H100 80GB with
CUDA 13.0 and torch 2.11 after initialisation and one matmul (684.8 MiB, bench/gpu/results); other
GPUs and drivers differ by a few hundred MiB (300-700 MiB with lazy module loading).
"""

from __future__ import annotations

CUDA_CONTEXT_BYTES = 685 * 2**20  # measured: H100 80GB, CUDA 13.0, torch 2.11, after init + one matmul
CUBLAS_WORKSPACE_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8  # ":4096:2:16:8", every GPU but sm90
CUBLAS_WORKSPACE_SM90 = 4096 * 8 * 1024  # 32 MiB default on Hopper (sm90)
CUBLASLT_WORKSPACE = 1024 * 1024  # CUBLASLT_WORKSPACE_SIZE default, 1024 KiB per thread (measured on H100)

# _transformer_encoder_layer_fwd: nn.TransformerEncoderLayer's fused inference op runs its Linears inside
FUSED_LINEAR_OPS = frozenset({"_transformer_encoder_layer_fwd"})
MATMUL_OPS = (
    frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "_scaled_mm"})
    | FUSED_LINEAR_OPS
)
LT_MATMUL_OPS = frozenset({"addmm"}) | FUSED_LINEAR_OPS  # bias epilogue: cublasLt (gemm_and_bias)
BACKWARD_THREAD_PHASES = frozenset({"backward"})  # autograd's device thread; the rest run on the caller's


def cuda_context_bytes() -> int:
    return CUDA_CONTEXT_BYTES


def cublas_workspace_bytes(*, hopper: bool, handles: int) -> int:
    """Bytes of cuBLAS workspace held by `handles` (thread, stream) pairs."""
    return handles * (CUBLAS_WORKSPACE_SM90 if hopper else CUBLAS_WORKSPACE_DEFAULT)


def uses_cublas(events: list) -> bool:
    """Whether any op in the trace is a cuBLAS matmul."""
    return any(tag == "op" and value.op in MATMUL_OPS for tag, value in events)


def cublaslt_threads(events: list) -> int:
    """How many threads (the caller's, autograd's) ran a cuBLASLt matmul in the trace: 0, 1 or 2."""
    threads = {
        value.phase in BACKWARD_THREAD_PHASES
        for tag, value in events
        if tag == "op" and value.op in LT_MATMUL_OPS
    }
    return len(threads)


def local_gpu_is_hopper() -> bool | None:
    """True/False for the local GPU, None when there is none."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()[0] == 9

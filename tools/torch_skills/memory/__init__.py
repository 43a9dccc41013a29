"""estimate_memory: peak training and inference memory of the user's model, predicted without a GPU.

The server imports only `torch_skills.memory.models`; the worker child runs `torch_skills.memory.worker.run`.
Pipeline: `trace` (one step on fake tensors under the storage `ledger`, with `modules` naming the
running module and `probes` measuring convolution/RNN kernel scratch) -> `sharding` (per-rank
rewrite) -> `timeline` replay through the CUDA `allocator` model plus `overheads` -> `estimate`
-> `search` (max batch size) -> `findings`. `groundtruth` measures real runs independently, for
the tests and bench/memory_accuracy.py.

Known limitations (each module states its own in detail):
- Without a GPU the step is traced with the CPU's kernels: CUDA-only kernel choices (autocast op
  lists, SDPA back-ends, cuDNN workspaces) are not reproduced; the CUDA allocator, cuBLAS
  workspaces, the CUDA context and the foreach optimizer are modelled instead.
- The CUDA context is a stated 512 MiB, not measured; NCCL buffers are not counted.
- Per-rank figures for ddp/zero1/zero2/fsdp are analytic rewrites of a one-device trace.
- Storage resizes outside aten ops (`UntypedStorage.resize_`) and sparse or wrapper-subclass
  tensors (DTensor) are not followed.
- Data-dependent control flow defeats tracing; the fallback then measures real runs at batch
  sizes 2 and 3 and extrapolates linearly, which needs the model to fit in this machine's RAM.
"""

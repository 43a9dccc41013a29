"""estimate_memory: peak training and inference memory of the user's model, predicted without a GPU.

The server imports only `tools.memory.models`; the worker child runs `tools.memory.worker.run`.
Pipeline: `trace` (one step on fake tensors under the storage `ledger`, with `modules` and
`probes`) -> `sharding` (per-rank rewrite) -> `timeline` replay with the CUDA `allocator` model and
`overheads` -> `estimate` -> `search` (max batch size) -> `findings`. `groundtruth` measures real
runs independently, for tests and bench/memory_accuracy.py.
"""

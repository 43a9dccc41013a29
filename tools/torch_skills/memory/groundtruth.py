"""Ground truth for estimate_memory: the peak memory of a real run, measured without the ledger.

Use (tests and bench/memory_accuracy.py; the tool itself never calls this):

    truth = measure_real_step(build_model, make_batch, loss_fn, spec, batch_size=8, device="cpu")
    truth.peak_allocated_bytes, truth.peak_reserved_bytes

It runs real training steps (three; the first creates the optimizer state) and measures:

- on CUDA, `torch.cuda.max_memory_allocated()` / `max_memory_reserved()` after
  `reset_peak_memory_stats()`: the caching allocator's own counters;
- on CPU, every allocation and free the CPU allocator reports to the profiler
  (`profile_memory=True`), summed in time order: the peak of live allocator bytes, including the
  scratch buffers kernels allocate for themselves.

Nothing here shares counting code with `torch_skills.memory.ledger`, so agreement between the two is
evidence, not an echo. Both sides use the same step (`StepSpec`) and the same model surgery
(`torch_skills.memory.trace.make_optimizer`, `wrap_checkpointing`, `convert_tensors`).

Each step runs as a function, so its output and loss die when it returns (as in a
`train_step()` function; a loop that keeps `output` alive into the next forward holds one more
output tensor).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map

from torch_skills.memory.trace import (
    AUTOCAST,
    LOW_PRECISION,
    StepSpec,
    call_model,
    convert_tensors,
    make_optimizer,
    wrap_checkpointing,
)


@dataclass
class Truth:
    device: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int | None  # CUDA only
    method: str


def measure_real_step(
    build_model: Callable[[], torch.nn.Module],
    make_batch: Callable[[int | None], Any],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    spec: StepSpec,
    *,
    batch_size: int | None,
    device: str = "cpu",
    steps: int = 3,
    seed: int = 0,
) -> Truth:
    """Run `steps` real steps of `spec` and return the measured peak (see the module docstring)."""
    dev = torch.device(device)
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        _run_steps(build_model, make_batch, loss_fn, spec, batch_size, dev, steps, seed)
        torch.cuda.synchronize()
        return Truth(
            device=str(dev),
            peak_allocated_bytes=torch.cuda.max_memory_allocated() - base,
            peak_reserved_bytes=torch.cuda.max_memory_reserved(),
            method="torch.cuda.max_memory_allocated/max_memory_reserved after reset_peak_memory_stats",
        )
    peak = cpu_allocator_peak(
        lambda: _run_steps(build_model, make_batch, loss_fn, spec, batch_size, dev, steps, seed)
    )
    return Truth(
        device="cpu",
        peak_allocated_bytes=peak,
        peak_reserved_bytes=None,
        method="peak of live CPU-allocator bytes from the profiler's allocation events",
    )


def cpu_allocator_peak(fn: Callable[[], Any]) -> int:
    """Peak bytes live in the CPU allocator while `fn()` runs, from the profiler's memory events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    allocations: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if (
            type(node.extra_fields).__name__ == "_ExtraFields_Allocation"
            and node.extra_fields.device.type == "cpu"
        ):
            allocations.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    allocations.sort(key=lambda a: a[0])
    live = peak = 0
    for _, delta in allocations:
        live += delta
        peak = max(peak, live)
    return peak


def _run_steps(
    build_model, make_batch, loss_fn, spec: StepSpec, batch_size, device, steps: int, seed: int
) -> None:
    torch.manual_seed(seed)
    model = build_model()
    convert_tensors(model, device, LOW_PRECISION.get(spec.precision))
    wrap_checkpointing(model, spec.checkpoint_classes)
    model.train(spec.mode == "train")
    batch = _prepare(make_batch(batch_size), device, LOW_PRECISION.get(spec.precision))
    autocast = (
        (lambda: torch.autocast(device_type=device.type, dtype=AUTOCAST[spec.precision]))
        if spec.precision in AUTOCAST
        else contextlib.nullcontext
    )
    if spec.mode != "train":
        for _ in range(steps):
            with torch.no_grad(), autocast():
                call_model(model, batch)
        return
    optimizer = make_optimizer(model, spec)

    def train_step() -> None:
        for _ in range(max(1, spec.micro_batches)):
            with autocast():
                output = call_model(model, batch)
                loss = loss_fn(output, batch)
            loss.backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)

    for _ in range(steps):
        train_step()


def _prepare(batch: Any, device: torch.device, float_dtype: torch.dtype | None) -> Any:
    def move(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            t = t.to(device)
            if float_dtype is not None and t.is_floating_point():
                t = t.to(float_dtype)
        return t

    return tree_map(move, batch)

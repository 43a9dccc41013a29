"""One instrumented step: FLOPs, bytes moved, op dispatches, and every host read of a tensor value.

Use `probe_step(runner, first_step=True)` -> `Probe`. It runs one step under `FlopCounterMode`, a dispatch mode
that counts ops and bytes and spots syncs, module hooks that say which module is running, and a
Python profile hook that catches `.tolist()`, `.numpy()`, `.cpu()` and `torch.cuda.synchronize()`
(calls that read values without an op the dispatcher sees on a CPU; skipped when a debugger or
profiler already holds the hook). Everything it installs is removed in `finally`.

What counts as a host sync: an op that needs a tensor's value on the host
(`aten::_local_scalar_dense`, from `.item()`, `bool(t)`, `float(t)`, `if t:`), an op whose output
size depends on the data (nonzero, masked_select, boolean-mask indexing, unique, repeat_interleave
without output_size), a copy from the GPU to the CPU, and the Python calls above. On a GPU each one
stalls the host until the device catches up; on a CPU they cost little, but they are named anyway
because they become syncs as soon as the model moves to a GPU. On a CPU, reads of CPU tensors in the
optimizer (AdamW reads its step counters) are left out: they stay host-side on any device.

profile_model probes the first step (the probe is its first warm-up step). What only a first step
does is left out of the counts: the optimizer making its state (`zeros_like` moments, step counters:
on GPT-2 and ResNet-18 those were the only ops a first AdamW step ran that a second did not, 8-16%
of its bytes).

Known limitations: an optimizer that makes fresh zero-filled tensors on every step has them left out
of the first step's bytes too; bytes moved is the size of every input and output of every non-view op,
an upper bound that ignores caches and fusion; FLOPs cover what FlopCounterMode has formulas for
(matmul, convolution, attention) plus flops.py's (fused RNN layers, grouped matmuls); elementwise
ops count zero.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from torch_skills import OWN_DIRS
from torch_skills.profiling.flops import flop_counter
from torch_skills.profiling.models import HostSync
from torch_skills.profiling.step import StepRunner, top_level_modules

aten = torch.ops.aten

# Ops whose output size depends on the tensor's values, so the host must wait for them on a GPU.
_DATA_DEPENDENT = {
    aten.nonzero.default: "aten::nonzero (output size depends on the data)",
    aten.masked_select.default: "aten::masked_select (output size depends on the data)",
    aten._unique2.default: "aten::unique (output size depends on the data)",
    aten.unique_dim.default: "aten::unique (output size depends on the data)",
    aten.unique_consecutive.default: "aten::unique_consecutive (output size depends on the data)",
    aten.repeat_interleave.Tensor: "aten::repeat_interleave without output_size",
}
_VALUE_READ = "tensor value read on the host (.item(), bool(t), float(t), if t:)"
_BOOL_INDEX = "boolean-mask indexing x[mask] (output size depends on the data)"
_TO_HOST = "copy from the GPU to the CPU (.to('cpu'))"
_PY_CALLS = {"tolist": "Tensor.tolist()", "numpy": "Tensor.numpy()", "cpu": "Tensor.cpu()"}
_FREE_OPS = {aten.detach.default, aten.alias.default, aten.empty.memory_format, aten.empty_strided.default,
             aten.empty_like.default, aten.lift_fresh.default}  # fmt: skip

# What an optimizer's first step runs to make its state (moments, step counters); later steps do not.
_STATE_CREATION = {aten.zeros_like.default, aten.zeros.default, aten.full.default, aten.full_like.default,
                   aten.ones_like.default, aten.scalar_tensor.default, aten.lift_fresh.default}  # fmt: skip

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_STDLIB_DIR = str(Path(sysconfig.get_paths()["stdlib"]).resolve())


@dataclass
class Probe:
    flops: int
    module_flops: dict[str, int]  # top-level module name -> FLOPs (forward and backward)
    bytes_moved: int
    ops: int
    syncs: list[HostSync]
    conv_weights_channels_last: bool | None  # None: no 4-D conv weight in the model

    @classmethod
    def empty(cls) -> Probe:
        """Nothing counted: what the result carries when the instrumented step failed."""
        return cls(flops=0, module_flops={}, bytes_moved=0, ops=0, syncs=[], conv_weights_channels_last=None)


def _is_library(filename: str) -> bool:
    if filename.startswith("<"):
        return True
    path = os.path.realpath(filename)
    return path.startswith((_TORCH_DIR, *OWN_DIRS, _STDLIB_DIR))


def user_location(frame: Any) -> str | None:
    """'file.py:line' of the innermost frame outside torch, this tool and the standard library."""
    while frame is not None:
        if not _is_library(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _nbytes(t: torch.Tensor) -> int:
    try:
        logical = t.numel() * t.element_size()
        return min(logical, t.untyped_storage().nbytes()) if t.layout == torch.strided else logical
    except (RuntimeError, NotImplementedError):
        return 0


@dataclass
class _State:
    phase: str | None = None
    modules: list[str] = field(default_factory=list)
    syncs: Counter = field(default_factory=Counter)  # (op, phase, module, location) -> calls


class _CountingMode(TorchDispatchMode):
    """Counts op dispatches and bytes, and records the ops that sync the host."""

    def __init__(self, state: _State, on_gpu: bool, first_step: bool = False):
        super().__init__()
        self.state = state
        self.on_gpu = on_gpu
        self.first_step = first_step
        self.ops = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "profiler":
            return out
        if self.first_step and self.state.phase == "optimizer" and func in _STATE_CREATION:
            return out  # the optimizer making its state: a first step's cost, not a step's
        self.ops += 1
        inputs = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        if not func.is_view and func not in _FREE_OPS:
            outputs = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
            self.bytes += sum(_nbytes(t) for t in inputs) + sum(_nbytes(t) for t in outputs)
        label = self._sync_label(func, inputs, kwargs)
        if label is not None:
            self._record(label)
        return out

    def _sync_label(self, func, inputs: list[torch.Tensor], kwargs: dict) -> str | None:
        on_device = any(t.device.type != "cpu" for t in inputs)
        if self.on_gpu and not on_device:
            return None  # reading a CPU tensor never waits for the GPU
        if not self.on_gpu and self.state.phase == "optimizer":
            return None  # optimizer bookkeeping on CPU tensors (AdamW step counters): host-side anywhere
        if func is aten._local_scalar_dense.default:
            return _VALUE_READ
        if func in _DATA_DEPENDENT:
            if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is not None:
                return None
            return _DATA_DEPENDENT[func]
        if func in (aten.index.Tensor, aten.index_put_.default, aten.index_put.default) and any(
            t.dtype == torch.bool for t in inputs[1:]
        ):
            return _BOOL_INDEX
        if func in (aten._to_copy.default, aten.copy_.default) and self.on_gpu:
            device = kwargs.get("device")
            if func is aten._to_copy.default and device is not None and torch.device(device).type == "cpu":
                return _TO_HOST
            if (
                func is aten.copy_.default
                and inputs[0].device.type == "cpu"
                and inputs[1].device.type != "cpu"
            ):
                return _TO_HOST
        return None

    def _record(self, label: str) -> None:
        module = self.state.modules[-1] if self.state.modules else None
        location = user_location(sys._getframe())
        self.state.syncs[(label, self.state.phase, module, location)] += 1


def _python_call_hook(state: _State, on_gpu: bool):
    """A sys.setprofile hook catching host reads that dispatch no op on a CPU."""
    synchronize_code = torch.cuda.synchronize.__code__

    def hook(frame, event, arg):
        if event == "c_call":
            name = getattr(arg, "__name__", None)
            owner = getattr(arg, "__self__", None)
            if name in _PY_CALLS and isinstance(owner, torch.Tensor):
                if name == "cpu" and owner.device.type == "cpu" and on_gpu:
                    return
                if not on_gpu and state.phase == "optimizer":
                    return
                location = user_location(frame)
                if location is not None:  # torch's own .cpu() calls are not the user's syncs
                    module = state.modules[-1] if state.modules else None
                    state.syncs[(_PY_CALLS[name], state.phase, module, location)] += 1
        elif event == "call" and frame.f_code is synchronize_code:
            module = state.modules[-1] if state.modules else None
            state.syncs[("torch.cuda.synchronize()", state.phase, module, user_location(frame.f_back))] += 1

    return hook


def _enter_module(state: _State, name: str):
    def hook(_module, _args) -> None:
        state.modules.append(name)

    return hook


def _leave_module(state: _State):
    def hook(_module, _args, _output) -> None:  # returns None: the output stays as it is
        if state.modules:
            state.modules.pop()

    return hook


def _conv_layout(model: torch.nn.Module) -> bool | None:
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    if not weights:
        return None
    return all(w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous() for w in weights)


def probe_step(runner: StepRunner, *, first_step: bool = False) -> Probe:
    """Run one step with every counter installed; restore everything afterwards. With `first_step`,
    the optimizer's state creation is not counted (see the module docstring)."""
    model = runner.model
    on_gpu = runner.device.type == "cuda"
    state = _State()
    handles = []
    for name, module in model.named_modules():
        if not name:
            continue
        handles.append(module.register_forward_pre_hook(_enter_module(state, name)))
        handles.append(module.register_forward_hook(_leave_module(state)))

    class _Phase:
        def __init__(self, name: str):
            self.name = name

        def __enter__(self):
            self.previous, state.phase = state.phase, self.name

        def __exit__(self, *exc):
            state.phase = self.previous

    counter = flop_counter()
    counting = _CountingMode(state, on_gpu, first_step)
    hook_python = sys.getprofile() is None  # never displace a debugger's or profiler's hook
    try:
        with counter, counting:
            if hook_python:
                sys.setprofile(_python_call_hook(state, on_gpu))
            try:
                runner.checked_step(_Phase)
            finally:
                if hook_python:
                    sys.setprofile(None)
    finally:
        for handle in handles:
            handle.remove()

    root = type(model).__name__
    per_module = counter.get_flop_counts()
    module_flops = {
        name: int(sum(per_module.get(f"{root}.{name}", {}).values())) for name, _ in top_level_modules(model)
    }
    syncs = [
        HostSync(op=op, calls_per_step=calls, phase=phase, module=module, location=location)
        for (op, phase, module, location), calls in state.syncs.items()
    ]
    syncs.sort(key=lambda s: (-s.calls_per_step, s.module or "", s.location or ""))
    return Probe(
        flops=int(counter.get_total_flops()),
        module_flops=module_flops,
        bytes_moved=int(counting.bytes),
        ops=counting.ops,
        syncs=syncs,
        conv_weights_channels_last=_conv_layout(model),
    )

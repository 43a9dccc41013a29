"""One training or inference step of the user's model, runnable many times with phase markers.

Use in the worker (the forked child):

    runner = build_step(request, job, device)        # model, batches, optimizer, precision
    wait_s = runner.step()                           # one step; seconds spent in next(loader)
    wait_s = runner.step(phase=my_marker)            # my_marker("forward") -> a context manager

`phase` wraps each part of the step: "data" (next(loader) and the copy to the device),
"forward", "loss", "backward", "optimizer". The profiler passes `record_function` markers, the
probe its own bookkeeping, the timed pass nothing (a shared no-op context).

Known limitations: the optimizer is AdamW(lr=1e-4) or SGD(lr=1e-3, momentum=0.9) over all
parameters that require grad; a custom optimizer or gradient clipping in the user's loop is not
part of the measured step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from torch_skills.profiling.models import ProfileRequest
from torch_skills.results import BatchRule
from torch_skills.runner.errors import UserCodeError
from torch_skills.runner.usercode import (
    build_model,
    call_model,
    describe_rule,
    load_callable,
    load_loss,
    make_batch,
    rule_loss,
    split_batch,
    to_device,
    user_code,
)

_END = object()
PhaseMarker = Callable[[str], contextlib.AbstractContextManager]
_NO_PHASE = contextlib.nullcontext()

CAST_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}
AUTOCAST_DTYPE = {"bf16_autocast": torch.bfloat16, "fp16_autocast": torch.float16}
MATMUL_DTYPE = {  # the dtype the step's matmuls run in, for the calibration matmul
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "bf16_autocast": torch.bfloat16,
    "fp16_autocast": torch.float16,
}


def top_level_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The model's children, with ModuleList/ModuleDict containers (never called themselves) opened."""
    out: list[tuple[str, torch.nn.Module]] = []
    for name, child in model.named_children():
        if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            out += [(f"{name}.{sub}", grandchild) for sub, grandchild in child.named_children()]
        else:
            out.append((name, child))
    return out


def no_phase(_: str) -> contextlib.AbstractContextManager:
    return _NO_PHASE


def cast_floats(obj: Any, dtype: torch.dtype | None) -> Any:
    """Cast every floating-point tensor in nested tuples, lists and dicts to `dtype`."""
    if dtype is None:
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, dict):
        return {k: cast_floats(v, dtype) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(cast_floats(v, dtype) for v in obj)
    return obj


def samples_in(batch: Any) -> int | None:
    """Leading size of the first tensor in the batch, the usual meaning of batch size."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        found = samples_in(item)
        if found is not None:
            return found
    return None


class BatchSource:
    """A fixed batch (inputs / input_shape), or the user's iterable, restarted when it runs out."""

    def __init__(self, *, fixed: Any = None, iterable: Any = None, device: torch.device, dtype=None):
        self.fixed = fixed
        self.iterable = iterable
        self.device = device
        self.dtype = dtype
        self.epochs = 0
        self.batches = 0
        self.last_samples = samples_in(fixed) if fixed is not None else None  # of the latest batch
        self._iterator: Iterator | None = None

    def next(self) -> tuple[Any, float]:
        """(batch on the device, seconds spent in next() of the loader)."""
        if self.iterable is None:
            return self.fixed, 0.0
        start = time.perf_counter()
        batch = self._next_raw()
        waited = time.perf_counter() - start
        self.last_samples = samples_in(batch)
        return cast_floats(to_device(batch, self.device), self.dtype), waited

    def _next_raw(self) -> Any:
        for _attempt in range(2):
            if self._iterator is None:
                with user_code("iterating the data loader"):
                    self._iterator = iter(self.iterable)
                self.epochs += 1
            with user_code("fetching a batch from the data loader"):
                batch = next(self._iterator, _END)
            if batch is not _END:
                self.batches += 1
                return batch
            if self._iterator is self.iterable:  # a generator or other one-shot iterator: it cannot restart
                raise UserCodeError(
                    "bad_request",
                    f"the data loader ran out after {self.batches} batches and, being a one-shot iterator, "
                    "cannot restart; return a DataLoader or a list (re-iterable), or yield more batches "
                    "(up to warmup_steps + 2 x active_steps + 1 are used, more with compile=True)",
                )
            self._iterator = None
        raise UserCodeError(
            "bad_request", "the data loader yielded no batch at all; give it at least one batch"
        )


@dataclass
class StepRunner:
    model: torch.nn.Module
    source: BatchSource
    loss_fn: Callable[[Any, Any, Any], tuple[torch.Tensor, str]]
    train: bool
    optimizer: torch.optim.Optimizer | None
    scaler: torch.amp.GradScaler | None
    autocast_dtype: torch.dtype | None
    device: torch.device
    batch_input: str  # "auto" | "whole" | "first" (ProfileRequest.batch_input)
    loss_how: str | None = None  # where the last step's loss came from
    batch_rule: BatchRule | None = None  # recorded on the first step (see rule())

    def with_model(self, model: torch.nn.Module) -> StepRunner:
        """The same step around another module holding the same parameters (e.g. torch.compile(model))."""
        return StepRunner(**{**self.__dict__, "model": model})

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return _NO_PHASE
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _model_input(self, batch: Any) -> Any:
        if self.batch_input != "first":
            return batch
        if not isinstance(batch, (tuple, list)) or not batch:
            raise UserCodeError(
                "bad_request",
                f"batch_input='first' needs batches that are tuples or lists, got {type(batch).__name__}; "
                "use batch_input='auto'",
            )
        return batch[0]

    def _call(self, batch: Any) -> Any:
        fed = self._model_input(batch)
        if self.batch_input == "whole" and isinstance(fed, (tuple, list)):
            return self.model(*fed)
        return call_model(self.model, fed)

    def target(self, batch: Any) -> Any:
        """The batch's target under batch_input (None when the batch has none)."""
        if self.batch_input == "first":
            return batch[1] if isinstance(batch, (tuple, list)) and len(batch) == 2 else None
        if self.batch_input == "whole":
            return None
        return split_batch(self.model, batch).target

    def rule(self, batch: Any) -> BatchRule:
        """The BatchRule result piece for this runner's batches."""
        if self.batch_input == "auto":
            return describe_rule(self.model, batch, self.loss_how)
        call = "model(batch[0]), target batch[1]" if self.batch_input == "first" else "model(*batch)"
        kind = "inputs_target" if self.batch_input == "first" else "positional"
        return BatchRule(batch=kind, call=call, loss=self.loss_how)

    def step(self, phase: PhaseMarker = no_phase) -> float:
        """Run one step; return the seconds spent waiting on the loader."""
        with phase("data"):
            batch, waited = self.source.next()
        if not self.train:
            with torch.inference_mode(), phase("forward"), self._autocast():
                self._call(batch)
            if self.batch_rule is None:
                self.batch_rule = self.rule(batch)
            return waited
        with phase("forward"), self._autocast():
            output = self._call(batch)
        with phase("loss"), self._autocast():
            loss, self.loss_how = self.loss_fn(output, batch, self.target(batch))
        if self.batch_rule is None:
            self.batch_rule = self.rule(batch)
        with phase("backward"):
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        with phase("optimizer"):
            assert self.optimizer is not None
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return waited

    def checked_step(self, phase: PhaseMarker = no_phase) -> float:
        """`step` with the user's exceptions turned into a message naming the step."""
        what = "the training step" if self.train else "the inference step"
        with user_code(f"{what} (forward, loss, backward, optimizer)" if self.train else what):
            return self.step(phase)


def _make_loss(request: ProfileRequest, job) -> Callable[[Any, Any, Any], tuple[torch.Tensor, str]]:
    """loss(output, batch, target) -> (scalar, where it came from): the user's, else the batch rule's."""
    if request.loss is None:
        return lambda output, _batch, target: rule_loss(output, target)
    fn = load_loss(request.loss, job.cwd, job.allowed_roots)
    how = f"user loss {request.loss}"

    def loss(output: Any, batch: Any, _target: Any) -> tuple[torch.Tensor, str]:
        value = fn(output, batch)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise UserCodeError(
                "bad_request", f"{request.loss} returned {shape}; a loss function must return a scalar tensor"
            )
        return value.reshape(()), how

    return loss


def _make_source(request: ProfileRequest, job, device: torch.device, dtype) -> BatchSource:
    if request.data is None:
        batch = make_batch(request, job.cwd, job.allowed_roots, device)
        return BatchSource(fixed=cast_floats(batch, dtype), device=device, dtype=dtype)
    factory = load_callable(request.data, job.cwd, job.allowed_roots, "the data loader factory", role="data")
    with user_code(f"calling the data loader factory {request.data}"):
        iterable = factory()
    if not hasattr(iterable, "__iter__"):
        raise UserCodeError(
            "bad_request",
            f"{request.data} returned a {type(iterable).__name__}, which is not iterable; "
            "return a DataLoader, a list of batches or a generator",
        )
    return BatchSource(iterable=iterable, device=device, dtype=dtype)


def _make_optimizer(request: ProfileRequest, model: torch.nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise UserCodeError(
            "bad_request",
            f"{request.model} has no parameters that require grad, so there is nothing to train; "
            "use mode='inference'",
        )
    if request.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-4)


def build_step(request: ProfileRequest, job, device: torch.device) -> StepRunner:
    """Build the model, the batches, the loss, the optimizer and the precision setup."""
    cast = CAST_DTYPE.get(request.precision)
    model = build_model(request, job.cwd, job.allowed_roots, device)
    if cast is not None:
        with user_code(f"casting the model to {cast}"):
            model = model.to(cast)
    model.train(request.mode == "train")
    source = _make_source(request, job, device, cast)
    train = request.mode == "train"
    autocast = AUTOCAST_DTYPE.get(request.precision)
    return StepRunner(
        model=model,
        source=source,
        loss_fn=_make_loss(request, job),
        train=train,
        optimizer=_make_optimizer(request, model) if train else None,
        scaler=torch.amp.GradScaler(device.type) if train and request.precision == "fp16_autocast" else None,
        autocast_dtype=autocast,
        device=device,
        batch_input=request.batch_input,
    )

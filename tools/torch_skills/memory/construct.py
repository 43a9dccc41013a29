"""Build a user's model on fake tensors even when its constructor reads tensor values.

Use it around the factory call inside a FakeTensorMode:

    with mode, fake_safe_construction():
        model = build_model()
    fakeify_real_tensors(model, mode)       # small tensors made for real become fake again

Real constructors read tensor values in two common ways, both fatal on fake tensors:
- small constant tensors turned into Python numbers, e.g. drop-path rates
  `[x.item() for x in torch.linspace(0, rate, depth)]` (timm, Hugging Face ConvNeXt/Swin);
  here factory calls (linspace, arange, zeros, tensor, ...) whose result has at most
  SMALL_NUMEL elements run for real on the CPU, and so does every op whose tensor inputs are
  all such real tensors (split, indexing, .item(), .tolist());
- `torch.nn.init.trunc_normal_`, which redraws until no value lies outside [a, b]
  (`mask.any()`): on a fake tensor it becomes normal_ then clamp_ (the values of fake tensors
  do not exist; only shapes, dtypes and devices matter for memory).

`describe_trace_failure(exc)` turns a failed trace into the real cause and the user's line, for
the message that says why the estimate fell back to real runs.

Known limitations: values read from a *large* tensor (above SMALL_NUMEL) in a constructor, and
any value read in forward, still fail on fake tensors; the fallback then measures real steps.
"""

from __future__ import annotations

import contextlib
import math
import sysconfig
import traceback
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from torch_skills import OWN_DIRS as _OWN_DIRS

# Factory results up to this many elements are made for real during construction, and ops on
# such real tensors stay real: enough for rate schedules and index tables, and small enough that
# even an outer product of two of them stays small (4096**2 floats = 64 MiB).
SMALL_NUMEL = 4096

_SIZED = {
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.rand,
    torch.randn,
    torch.full,
}
_STEPS = {torch.linspace, torch.logspace}
_LITERAL = {torch.tensor, torch.as_tensor}


def _size_numel(args: tuple, kwargs: dict) -> int | None:
    size = kwargs.get("size")
    if size is None and args:
        size = args[0] if isinstance(args[0], (tuple, list, torch.Size)) else args
    if not size or not all(isinstance(d, int) and not isinstance(d, bool) for d in size):
        return None
    return math.prod(size)


def _factory_numel(func: Any, args: tuple, kwargs: dict) -> int | None:
    """Elements the factory call would make, or None when it is not a plain factory call."""
    try:
        if func in _STEPS:
            steps = kwargs.get("steps", args[2] if len(args) > 2 else None)
            return int(steps) if isinstance(steps, int) else None
        if func is torch.arange:
            nums = [a for a in args if isinstance(a, (int, float))]
            start, end, step = (
                (0, nums[0], 1) if len(nums) == 1 else (*nums[:2], nums[2] if len(nums) > 2 else 1)
            )
            return max(0, math.ceil((end - start) / step)) if step else None
        if func is torch.full:
            size = args[0] if args else kwargs.get("size")
            return math.prod(size) if isinstance(size, (tuple, list, torch.Size)) else None
        if func in _SIZED:
            return _size_numel(args, kwargs)
        if func in _LITERAL:
            data = args[0] if args else kwargs.get("data")
            return None if isinstance(data, torch.Tensor) else 1
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return None


class _SmallConstantsReal(TorchFunctionMode):
    """Small factory calls, and every op whose tensor inputs are all small real tensors, run for real."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if tensors:
            real = not any(isinstance(t, FakeTensor) or t.device.type == "meta" for t in tensors)
            if real and sum(t.numel() for t in tensors) <= SMALL_NUMEL:
                with unset_fake_temporarily():
                    return func(*args, **kwargs)
            return func(*args, **kwargs)
        numel = _factory_numel(func, args, kwargs)
        device = kwargs.get("device")
        if (
            numel is not None
            and numel <= SMALL_NUMEL
            and (device is None or torch.device(device).type == "cpu")
        ):
            with unset_fake_temporarily():
                return func(*args, **{**kwargs, "device": "cpu"})
        return func(*args, **kwargs)


def _fake_safe_trunc_normal(original):
    def trunc_normal(tensor, mean, std, a, b, generator=None):
        from torch._subclasses.fake_tensor import FakeTensor

        if isinstance(tensor, FakeTensor):
            with torch.no_grad():
                return tensor.normal_(mean, std).clamp_(a, b)
        return original(tensor, mean, std, a, b, generator=generator)

    return trunc_normal


@contextlib.contextmanager
def fake_safe_construction() -> Iterator[None]:
    """Small factories run for real and trunc_normal_ is fake-safe while the block runs.

    Both are restored afterwards, and so is the CPU random generator the real factories drew from."""
    import torch.nn.init as init

    original = init._no_grad_trunc_normal_
    rng = torch.random.get_rng_state()  # small real factories draw from it; a fake build must not
    init._no_grad_trunc_normal_ = _fake_safe_trunc_normal(original)
    try:
        with _SmallConstantsReal():
            yield
    finally:
        init._no_grad_trunc_normal_ = original
        torch.random.set_rng_state(rng)


def fakeify_real_tensors(model: torch.nn.Module, mode: Any) -> None:
    """Turn the real parameters and buffers a guarded construction left into fake ones (ties kept)."""
    from torch._subclasses.fake_tensor import FakeTensor

    done: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is None or isinstance(param, FakeTensor) or param.device.type == "meta":
                continue
            if id(param) not in done:
                done[id(param)] = torch.nn.Parameter(mode.from_tensor(param.detach()), param.requires_grad)
            module._parameters[name] = done[id(param)]
        for name, buf in module._buffers.items():
            if buf is None or isinstance(buf, FakeTensor) or buf.device.type == "meta":
                continue
            module._buffers[name] = done.setdefault(id(buf), mode.from_tensor(buf))


# -- why a trace failed -------------------------------------------------------------------------
_LIBRARY_DIRS = tuple(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))


def _innermost_user_line(exc: BaseException) -> str | None:
    """'file.py:42 (code)' of the innermost frame outside torch-skills and the standard library.

    Third-party libraries (transformers, timm) count as the user's code here: their line is
    where the model does the data-dependent thing."""
    where = None
    for frame in traceback.extract_tb(exc.__traceback__):
        name = frame.filename
        if name.startswith("<") or name.startswith(_OWN_DIRS) or "/torch/" in name:
            continue
        if name.startswith(_LIBRARY_DIRS) and "site-packages" not in name and "dist-packages" not in name:
            continue
        where = f"{name}:{frame.lineno}" + (f" ({frame.line.strip()[:120]})" if frame.line else "")
    return where


def describe_trace_failure(exc: BaseException, phase: str) -> str:
    """One line: what failed on fake tensors, where, and in which phase ('the model factory', 'the step')."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    text = f"{type(root).__name__}: {str(root).strip().splitlines()[0][:200] if str(root).strip() else ''}"
    if isinstance(root, DataDependentOutputException) or "_local_scalar_dense" in str(root):
        what = "reads a tensor's value (.item(), .tolist(), float(t), `if t:`)"
    elif isinstance(root, DynamicOutputShapeException):
        what = "runs an op whose output shape depends on tensor values (nonzero, boolean masking, unique)"
    else:
        what = f"raised {text}"
    where = _innermost_user_line(root)
    return f"{phase} {what}" + (f" at {where}" if where else "")

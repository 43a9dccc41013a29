"""Worker side of the user-code contract: import the user's factory, build inputs, compute a loss.

Use inside a tool function (which runs in the forked child):

    model = load_model(request, job)            # nn.Module on job.device
    batch = make_batch(request, job)             # tensor / tuple / dict on job.device
    with user_code("the forward pass"):
        output = call_model(model, batch)
    loss, how = compute_loss(request, job, output, batch)

Every failure is a `UserCodeError` whose message names the file and the next step, e.g.
"no callable `build` in models.py; found: make_model, Net".
"""

from __future__ import annotations

import contextlib
import inspect
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch_skills.runner.codeimport import import_reference
from torch_skills.runner.errors import UserCodeError
from torch_skills.userspec import ModelInputs

_DTYPES = {
    "float32": "float32",
    "float64": "float64",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "int64": "int64",
    "int32": "int32",
    "bool": "bool",
}


def _short_traceback(exc: BaseException, limit: int = 6) -> str:
    lines = traceback.format_exception(exc)
    return "".join(lines[-limit:]).rstrip()


@contextlib.contextmanager
def user_code(phase: str) -> Iterator[None]:
    """Turn an exception raised while running the user's code into a UserCodeError naming the phase."""
    try:
        yield
    except UserCodeError:
        raise
    except SystemExit:
        raise
    except MemoryError:
        raise
    except Exception as exc:
        if "can't allocate memory" in str(exc) or "out of memory" in str(exc):
            raise
        raise UserCodeError(
            "user_exception",
            f"{phase} raised {type(exc).__name__}: {str(exc)[:1500]}\n{_short_traceback(exc)}",
        ) from exc


def load_callable(reference: str, cwd: Path, roots: list[Path], what: str = "callable") -> Any:
    """Import the object a `file.py:name` / `pkg.mod:name` reference names, after the reference rule's
    checks (`torch_skills.runner.codeimport`: one import path for every tool)."""
    return import_reference(reference, cwd, roots, what)


def _accepts(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def resolve_device(device: str):
    """'auto' -> cuda if available else cpu; 'cuda' without a GPU is a clear error."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UserCodeError(
            "bad_request",
            "device='cuda' was asked for but this machine has no CUDA device; use 'cpu' or 'auto'",
        )
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def build_model(
    spec: ModelInputs, cwd: Path, roots: list[Path], device: Any = None, *, to_device: bool = True
):
    """Call the user's factory and check it returns an nn.Module."""
    import torch

    factory = load_callable(spec.model, cwd, roots, "the model factory")
    with user_code(f"calling the model factory {spec.model}"):
        model = factory(**spec.model_kwargs)
    if not isinstance(model, torch.nn.Module):
        raise UserCodeError(
            "bad_request",
            f"{spec.model} returned a {type(model).__name__}, not a torch.nn.Module; the factory must build and return the model",
        )
    if to_device and device is not None:
        with user_code("moving the model to the device"):
            model = model.to(device)
    return model


def make_batch(
    spec: ModelInputs, cwd: Path, roots: list[Path], device: Any = None, batch_size: int | None = None
):
    """One batch: from the user's `make_inputs` (passing batch_size when it takes one) or random data."""
    import torch

    if spec.inputs is not None:
        make = load_callable(spec.inputs, cwd, roots, "the inputs function")
        kwargs = {"batch_size": batch_size} if batch_size is not None and _accepts(make, "batch_size") else {}
        with user_code(f"calling the inputs function {spec.inputs}"):
            batch = make(**kwargs)
    else:
        shape = list(spec.input_shape or [])
        if batch_size is not None:
            shape[0] = batch_size
        dtype = getattr(torch, _DTYPES[spec.input_dtype])
        gen = torch.Generator().manual_seed(0)
        if dtype.is_floating_point:
            batch = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
        elif dtype == torch.bool:
            batch = torch.rand(shape, generator=gen) > 0.5
        else:
            batch = torch.randint(0, 2, shape, generator=gen, dtype=dtype)
    return to_device(batch, device) if device is not None else batch


def to_device(obj: Any, device: Any) -> Any:
    """Move every tensor inside nested tuples, lists and dicts."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        moved = [to_device(v, device) for v in obj]
        return type(obj)(moved) if not hasattr(obj, "_fields") else type(obj)(*moved)
    return obj


def call_model(model: Any, batch: Any) -> Any:
    """`model(batch)` for a tensor, `model(*batch)` for a tuple/list, `model(**batch)` for a dict."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def default_loss(output: Any):
    """Reduce any output to a scalar: the mean of a tensor, or the sum of the means of all float tensors."""
    import torch

    tensors = [t for t in _flatten(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not tensors:
        raise UserCodeError(
            "bad_request",
            "the model's output holds no floating-point tensor to reduce to a loss; pass loss='file.py:loss_fn'",
        )
    loss = tensors[0].float().mean()
    for t in tensors[1:]:
        loss = loss + t.float().mean()
    return loss


def _flatten(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _flatten(v)]
    if isinstance(obj, (list, tuple)):
        return [x for v in obj for x in _flatten(v)]
    if hasattr(obj, "to_tuple"):  # Hugging Face ModelOutput
        return _flatten(obj.to_tuple())
    return [obj]


DEFAULT_LOSS_DESCRIPTION = "mean of the output (sum of the means of every float tensor in it)"


def compute_loss(spec: ModelInputs, cwd: Path, roots: list[Path], output: Any, batch: Any) -> tuple[Any, str]:
    """(scalar loss, how it was computed) using the user's loss_fn when given."""
    import torch

    if spec.loss is None:
        return default_loss(output), DEFAULT_LOSS_DESCRIPTION
    loss_fn = load_callable(spec.loss, cwd, roots, "the loss function")
    with user_code(f"calling the loss function {spec.loss}"):
        loss = loss_fn(output, batch)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise UserCodeError(
            "bad_request", f"{spec.loss} returned {shape}; a loss function must return a scalar tensor"
        )
    return loss.reshape(()), f"user loss {spec.loss}"

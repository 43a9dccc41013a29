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
import dataclasses
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch_skills.refpolicy import ReferenceRefused, check_model_kwargs
from torch_skills.runner.codeimport import import_reference
from torch_skills.runner.errors import UserCodeError
from torch_skills.runner.tracebacks import user_location, user_traceback
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
        where = user_location(exc)
        raise UserCodeError(
            "user_exception",
            f"{phase} raised {type(exc).__name__}: {str(exc)[:1500]}"
            + (f" (at {where})" if where else "")
            + f"\n{user_traceback(exc, with_error=False)}",
        ) from exc


def load_callable(
    reference: str, cwd: Path, roots: list[Path], what: str = "callable", *, role: str = "inputs"
) -> Any:
    """What may be called for a `file.py:name` / `pkg.mod:name` reference in `role` ('model',
    'inputs', 'loss', 'data', 'function'), after the reference rule's checks
    (`torch_skills.runner.codeimport`: one import path for every tool)."""
    return import_reference(reference, cwd, roots, what, role=role)


def load_loss(reference: str, cwd: Path, roots: list[Path]) -> Any:
    """loss_fn(output, batch) for a `loss` reference: the user's function, or a torch.nn loss class
    ('torch.nn:CrossEntropyLoss') built with no arguments and called on (the output's main tensor,
    the batch's target: its last element, or its 'labels')."""
    fn = load_callable(reference, cwd, roots, "the loss function", role="loss")
    if not (isinstance(fn, type) and fn.__module__.startswith("torch.nn.")):
        return fn  # the user's own function (or class), called as loss_fn(output, batch)
    with user_code(f"building the loss {reference}"):
        criterion = fn()

    def loss(output: Any, batch: Any) -> Any:
        if isinstance(batch, dict):
            target = next(
                (batch[k] for k in ("labels", "label", "target", "targets", "y") if k in batch), None
            )
        elif isinstance(batch, (tuple, list)) and len(batch) >= 2:
            target = batch[-1]
        else:
            target = None
        if target is None:
            raise UserCodeError(
                "bad_request",
                f"{reference} needs a target, but the batch has none (a tuple's last element, or 'labels' in a "
                "dict); return (inputs, target) from inputs, or pass loss='file.py:loss_fn'",
            )
        return criterion(_main_tensor(output), target)

    return loss


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

    factory = load_callable(spec.model, cwd, roots, "the model factory", role="model")
    try:
        check_model_kwargs(spec.model_kwargs, cwd, roots)  # again here: the server checked them too
    except ReferenceRefused as exc:
        raise UserCodeError("bad_request", str(exc)) from exc
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


# -- the batch rule: how a batch is fed to the model and what becomes the loss ------------------
# One rule for every tool, as training loops have batches:
#   tensor        -> model(x)
#   dict          -> model(**batch)                       (Hugging Face: labels in it give output.loss)
#   tuple / list  -> model(*batch) when forward takes that many positional arguments; one element
#                    more than it can take is the target:  model(*batch[:-1]), target = batch[-1]
# The default loss is, in order: the model's own loss (`output.loss`, output["loss"], or the one
# scalar in a tuple output such as nanoGPT's (logits, loss)); a target-aware loss when the batch
# has a target (cross-entropy for integer class targets, MSE for float targets of the output's
# shape); else the mean of the output. Every tool reports the rule it applied (`BatchRule`).


@dataclass
class BatchSplit:
    """A batch cut into what the model is called with and the target, with the rule's name."""

    args: tuple
    kwargs: dict
    target: Any
    kind: str  # "tensor" | "positional" | "inputs_target" | "dict" | "other"
    call: str  # e.g. "model(*batch[:-1])"


def _positional_capacity(model: Any) -> tuple[int, float]:
    """(required, accepted) positional arguments of model.forward (accepted is inf with *args)."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper takes (*args, **kwargs)
    forward = getattr(model, "forward", model)
    try:
        params = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        return 0, float("inf")
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return sum(p.default is p.empty for p in positional), float("inf")
    return sum(p.default is p.empty for p in positional), len(positional)


def split_batch(model: Any, batch: Any) -> BatchSplit:
    """Apply the batch rule above to `batch` for `model`."""
    if isinstance(batch, dict):
        return BatchSplit((), dict(batch), None, "dict", "model(**batch)")
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "_fields"):
        _, accepted = _positional_capacity(model)
        if len(batch) == accepted + 1 and len(batch) >= 2:
            head = "batch[0]" if len(batch) == 2 else f"*batch[:{len(batch) - 1}]"
            return BatchSplit(
                tuple(batch[:-1]), {}, batch[-1], "inputs_target", f"model({head}), target batch[-1]"
            )
        return BatchSplit(tuple(batch), {}, None, "positional", "model(*batch)")
    import torch

    if isinstance(batch, torch.Tensor):
        return BatchSplit((batch,), {}, None, "tensor", "model(batch)")
    return BatchSplit((batch,), {}, None, "other", f"model(batch) with a {type(batch).__name__}")


def call_model(model: Any, batch: Any) -> Any:
    """Call the model on a batch by the batch rule (see split_batch)."""
    split = split_batch(model, batch)
    return model(*split.args, **split.kwargs)


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
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [x for f in dataclasses.fields(obj) for x in _flatten(getattr(obj, f.name))]
    return [obj]


DEFAULT_LOSS_DESCRIPTION = "mean of the output (sum of the means of every float tensor in it)"


def _is_scalar_loss(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() == 1


def own_loss(output: Any) -> tuple[Any, str] | None:
    """The loss the model computed itself, if its output carries one."""
    import torch

    value = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if _is_scalar_loss(value):
        return value.reshape(()), "output.loss (the model's own loss)"
    if isinstance(output, (tuple, list)) and not isinstance(output, torch.Tensor):
        scalars = [i for i, t in enumerate(output) if _is_scalar_loss(t) and t.dim() == 0]
        if len(scalars) == 1 and len(output) > 1:
            i = scalars[0]
            return output[i].reshape(()), f"output[{i}], the one scalar the model returned (its own loss)"
    return None


def _main_tensor(output: Any):
    import torch

    if isinstance(output, torch.Tensor):
        return output
    logits = output.get("logits") if isinstance(output, dict) else getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    floats = [t for t in _flatten(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return floats[0] if floats else None


def target_loss(output: Any, target: Any) -> tuple[Any, str] | None:
    """A loss from the output and the batch's target, when their shapes say which one; else None.

    Integer targets: cross-entropy, classes on dim 1 ((N, C, ...) vs (N, ...)) or on the last dim
    ((B, T, V) vs (B, T), the language-model layout). Float targets of the output's shape (or the
    output's with a trailing 1 dropped): mean squared error."""
    import torch
    import torch.nn.functional as F

    out = _main_tensor(output)
    if out is None or not isinstance(target, torch.Tensor) or not out.is_floating_point():
        return None
    if not target.is_floating_point() and target.dtype != torch.bool:
        if (
            out.dim() >= 2
            and out.shape[0] == target.shape[0]
            and tuple(out.shape[2:]) == tuple(target.shape[1:])
        ):
            return F.cross_entropy(
                out.float(), target.long()
            ), "cross_entropy(output, target) (classes on dim 1)"
        if out.dim() >= 2 and tuple(out.shape[:-1]) == tuple(target.shape):
            flat = out.float().reshape(-1, out.shape[-1])
            return F.cross_entropy(
                flat, target.reshape(-1).long()
            ), "cross_entropy(output, target) (classes on the last dim)"
        return None
    if target.is_floating_point():
        if out.shape == target.shape:
            return F.mse_loss(out.float(), target.float()), "mse_loss(output, target)"
        if out.dim() == target.dim() + 1 and out.shape[-1] == 1 and out.shape[:-1] == target.shape:
            return F.mse_loss(out.float().squeeze(-1), target.float()), "mse_loss(output.squeeze(-1), target)"
    return None


def compute_loss(
    spec: ModelInputs, cwd: Path, roots: list[Path], output: Any, batch: Any, model: Any = None
) -> tuple[Any, str]:
    """(scalar loss, how it was computed): the user's loss_fn when given, else the rule above.

    Pass `model` so a batch's target is known (split_batch); without it the batch is taken whole."""
    import torch

    if spec.loss is None:
        return rule_loss(output, split_batch(model, batch).target if model is not None else None)
    loss_fn = load_loss(spec.loss, cwd, roots)
    with user_code(f"calling the loss function {spec.loss}"):
        loss = loss_fn(output, batch)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise UserCodeError(
            "bad_request", f"{spec.loss} returned {shape}; a loss function must return a scalar tensor"
        )
    return loss.reshape(()), f"user loss {spec.loss}"


def rule_loss(output: Any, target: Any = None) -> tuple[Any, str]:
    """The default loss of the batch rule: own loss, then target-aware, then the mean."""
    found = own_loss(output)
    if found is not None:
        return found
    if target is not None:
        found = target_loss(output, target)
        if found is not None:
            return found
    note = ""
    if target is not None:
        note = "; the batch's target fits no default loss (pass loss='file.py:loss_fn')"
    elif (isinstance(output, dict) and "loss" in output) or hasattr(output, "loss"):
        note = "; output.loss is None: put the labels in the batch so the model computes its own loss"
    return default_loss(output), DEFAULT_LOSS_DESCRIPTION + note


def describe_rule(model: Any, batch: Any, loss_how: str | None):
    """The BatchRule result piece for a batch and the loss description."""
    from torch_skills.results import BatchRule

    split = split_batch(model, batch)
    return BatchRule(batch=split.kind, call=split.call, loss=loss_how)

"""Gradcheck mode: does a custom function's backward agree with finite differences?

Use `check_function(fn, args, name=..., kind=..., fast_mode=False, second_order=False)` with
float64 `args` (`prepare_arguments` makes them); it returns a `GradcheckReport` with
torch.autograd.gradcheck's verdict and message plus this module's own comparison of the full
numerical and analytical Jacobians, which names the worst entry (which output element, which
input element, both values).

The Jacobians cost two function calls per input element and one backward per output element, so
inputs are capped at MAX_ELEMENTS elements each way: gradcheck is for small, representative
shapes such as [3, 4].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torch_skills.gradients.models import GradcheckReport, JacobianEntry
from torch_skills.gradients.tensors import finite_or_none, tensors_in
from torch_skills.runner.errors import UserCodeError

MAX_ELEMENTS = 2048  # per side of the Jacobian; 2 calls per input element at double precision
# torch.autograd.gradcheck's defaults (torch/autograd/gradcheck.py).
EPS, ATOL, RTOL = 1e-6, 1e-5, 1e-3
MESSAGE_CHARS = 1500


def prepare_arguments(batch: Any) -> tuple[tuple[Any, ...], list[str] | None]:
    """(positional values, keyword names or None): floating tensors become float64 leaves requiring grad."""
    if isinstance(batch, dict):
        keys: list[str] | None = list(batch)
        values = tuple(batch.values())
    elif isinstance(batch, (tuple, list)):
        keys, values = None, tuple(batch)
    else:
        keys, values = None, (batch,)

    def cast(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v.detach().to(torch.float64).requires_grad_(True)
        return v

    return tuple(cast(v) for v in values), keys


def bind(fn: Callable[..., Any], keys: list[str] | None) -> Callable[..., Any]:
    """A positional-only wrapper around fn (gradcheck passes inputs positionally)."""
    if keys is None:
        return fn
    return lambda *values: fn(**dict(zip(keys, values, strict=True)))


def _differentiable_outputs(out: Any) -> list[torch.Tensor]:
    return [t for t in tensors_in(out) if t.is_floating_point() or t.is_complex()]


def check_function(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    name: str,
    kind: str,
    fast_mode: bool,
    second_order: bool,
) -> GradcheckReport:
    """Run gradcheck (and gradgradcheck) on fn(*args) and compare the Jacobians entry by entry."""
    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if not inputs:
        raise UserCodeError(
            "bad_request",
            "gradcheck needs at least one floating-point tensor argument; give input_shape or an inputs "
            "function that returns float tensors",
        )
    sizes = sum(t.numel() for t in inputs)
    if sizes > MAX_ELEMENTS:
        raise UserCodeError(
            "bad_request",
            f"the inputs have {sizes} elements; gradcheck compares full Jacobians, so keep them to "
            f"{MAX_ELEMENTS} or fewer (e.g. input_shape [3, 4]): the bug shows on small shapes too",
        )
    outputs = _differentiable_outputs(fn(*args))
    if not outputs:
        raise UserCodeError(
            "bad_request", f"{name} returned no floating-point tensor, so there is nothing to check"
        )
    out_size = sum(t.numel() for t in outputs)
    if out_size > MAX_ELEMENTS:
        raise UserCodeError(
            "bad_request",
            f"{name} returns {out_size} elements; keep outputs to {MAX_ELEMENTS} or fewer with smaller inputs",
        )

    passed, message = _run(torch.autograd.gradcheck, fn, args, fast_mode)
    worst, max_error = None, None
    try:
        worst, max_error = _worst_entry(fn, args)
    except Exception as exc:  # a backward that raises: gradcheck already reported it
        message = message or _short(f"{type(exc).__name__}: {exc}")
        passed = False
    report = GradcheckReport(
        function=name,
        function_kind=kind,  # type: ignore[arg-type]
        input_shapes=[list(t.shape) for t in inputs],
        passed=passed,
        message=message,
        max_abs_error=finite_or_none(max_error) if max_error is not None else None,
        worst=worst,
        worst_output=[worst.output_tensor, *worst.output_index] if worst else None,
        worst_input=[worst.input_tensor, *worst.input_index] if worst else None,
        fast_mode=fast_mode,
        eps=EPS,
        atol=ATOL,
        rtol=RTOL,
    )
    if second_order:
        report.gradgradcheck_passed, report.gradgradcheck_message = _run(
            torch.autograd.gradgradcheck, fn, args, fast_mode
        )
    return report


def _run(
    check: Callable[..., bool], fn: Callable[..., Any], args: tuple, fast_mode: bool
) -> tuple[bool, str]:
    try:
        ok = check(fn, args, eps=EPS, atol=ATOL, rtol=RTOL, raise_exception=True, fast_mode=fast_mode)
        return bool(ok), ""
    except Exception as exc:  # GradcheckError, or the user's backward raising
        return False, _short(f"{type(exc).__name__}: {exc}")


def _short(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + " [...]"


def _flat_outputs(fn: Callable[..., Any], args: tuple) -> list[torch.Tensor]:
    return [t.reshape(-1) for t in _differentiable_outputs(fn(*args))]


def _numerical_jacobian(fn: Callable[..., Any], args: tuple, inputs_at: list[int]) -> torch.Tensor:
    """(n_in, n_out) central differences, input elements in argument order."""
    plain = [
        a.detach().clone(memory_format=torch.contiguous_format) if isinstance(a, torch.Tensor) else a
        for a in args
    ]
    columns = []
    with torch.no_grad():
        for position in inputs_at:
            flat = plain[position].view(-1)  # (numel,) view into the argument
            for i in range(flat.numel()):
                original = flat[i].item()
                flat[i] = original + EPS
                plus = torch.cat([t.to(torch.float64) for t in _flat_outputs(fn, tuple(plain))])
                flat[i] = original - EPS
                minus = torch.cat([t.to(torch.float64) for t in _flat_outputs(fn, tuple(plain))])
                flat[i] = original
                columns.append((plus - minus) / (2 * EPS))  # (n_out,)
    return torch.stack(columns)


def _analytical_jacobian(fn: Callable[..., Any], args: tuple, inputs_at: list[int]) -> torch.Tensor:
    """(n_in, n_out) from one backward per output element."""
    inputs = [args[p] for p in inputs_at]
    outputs = torch.cat([t.to(torch.float64) for t in _flat_outputs(fn, args)])  # (n_out,)
    rows = []
    for j in range(outputs.numel()):
        grads = torch.autograd.grad(outputs[j], inputs, retain_graph=True, allow_unused=True)
        rows.append(
            torch.cat(
                [
                    (g if g is not None else torch.zeros_like(x)).reshape(-1).to(torch.float64)
                    for g, x in zip(grads, inputs, strict=True)
                ]
            )
        )  # (n_in,)
    return torch.stack(rows).T


def _worst_entry(fn: Callable[..., Any], args: tuple) -> tuple[JacobianEntry, float]:
    inputs_at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    numerical = _numerical_jacobian(fn, args, inputs_at)  # (n_in, n_out)
    analytical = _analytical_jacobian(fn, args, inputs_at)  # (n_in, n_out)
    error = (numerical - analytical).abs()
    flat_at = int(torch.argmax(torch.nan_to_num(error, nan=float("inf"))))
    row, col = divmod(flat_at, error.shape[1])
    in_tensor, in_index = _locate(row, [args[p] for p in inputs_at])
    out_tensor, out_index = _locate(col, _differentiable_outputs(fn(*args)))
    entry = JacobianEntry(
        output_tensor=out_tensor,
        output_index=out_index,
        input_tensor=inputs_at[in_tensor],
        input_index=in_index,
        numerical=finite_or_none(float(numerical[row, col])),
        analytical=finite_or_none(float(analytical[row, col])),
    )
    return entry, float(error[row, col])


def _locate(flat: int, tensors: list[torch.Tensor]) -> tuple[int, list[int]]:
    """Flat position across concatenated tensors -> (which tensor, multi-index inside it)."""
    for k, t in enumerate(tensors):
        if flat < t.numel():
            index = []
            for size in reversed(t.shape):
                flat, r = divmod(flat, size)
                index.append(r)
            return k, index[::-1]
        flat -= t.numel()
    raise IndexError("position beyond the tensors")

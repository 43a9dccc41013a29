"""Small tensor helpers shared by the gradient probes (worker side only: imports torch).

Use `tensors_in(obj)` to collect the tensors in nested outputs, `is_finite(t)` / `kind_of(t)` to
test them, and `user_source()` for the 'file.py:line' of the user's code calling into torch.
"""

from __future__ import annotations

import math
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

import torch

from torch_skills import OWN_DIRS as _TOOLS_DIRS

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_STDLIB_DIR = sysconfig.get_paths()["stdlib"] + os.sep
_SITE_DIRS = tuple({sysconfig.get_paths()[k] + os.sep for k in ("purelib", "platlib")})


def tensors_in(obj: Any, depth: int = 0) -> list[torch.Tensor]:
    """Every tensor inside nested tuples, lists, dicts and Hugging Face ModelOutputs."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 8:
        return []
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_in(v, depth + 1)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors_in(v, depth + 1)]
    if hasattr(obj, "to_tuple"):
        return tensors_in(obj.to_tuple(), depth + 1)
    return []


def checkable(t: torch.Tensor) -> bool:
    """Dense floating/complex tensors with data: the ones that can hold NaN/Inf."""
    return (
        (t.is_floating_point() or t.is_complex())
        and t.layout == torch.strided
        and t.device.type != "meta"
        and t.numel() > 0
    )


def is_finite(t: torch.Tensor) -> bool:
    return not checkable(t) or bool(torch.isfinite(t.detach()).all())


def kind_of(t: torch.Tensor) -> str:
    """'nan', 'inf' or 'nan_and_inf' for a tensor known to hold a non-finite value."""
    d = t.detach()
    has_nan = bool(torch.isnan(d).any())
    has_inf = bool(torch.isinf(d).any())
    if has_nan and has_inf:
        return "nan_and_inf"
    return "nan" if has_nan else "inf"


def finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def user_source(cwd: Path | None = None) -> str | None:
    """'path.py:line' of the innermost caller outside torch and the stdlib, if it is the user's code.

    None when the call came straight from this tool through torch's own modules (an nn.Linear's
    forward, the default loss): the module name says more than a line inside torch would.
    """
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_TOOLS_DIRS):  # the tracer itself
        frame = frame.f_back
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_TOOLS_DIRS):  # back in the tool that called the model: no user frame
            return None
        if not (
            filename.startswith(_TORCH_DIR)
            or (filename.startswith(_STDLIB_DIR) and not filename.startswith(_SITE_DIRS))
            or filename.startswith("<")
        ):
            return f"{_relative(filename, cwd)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _relative(filename: str, cwd: Path | None) -> str:
    if cwd is not None:
        try:
            return str(Path(filename).resolve().relative_to(cwd.resolve()))
        except ValueError:
            pass
    return filename

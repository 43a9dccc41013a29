"""Result pieces shared by every tool: findings, run information, unit formatting.

Use `Finding(severity="warning", code="dead_relu", message="...", skill="debugging-techniques")`
in a tool's result, and `format_bytes(n)` / `format_seconds(s)` when writing its `summary`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

SkillName = Literal[
    "using-pytorch-engineering",
    "tensor-operations-and-memory",
    "module-design-patterns",
    "distributed-training-strategies",
    "mixed-precision-and-optimization",
    "performance-profiling",
    "debugging-techniques",
    "checkpointing-and-reproducibility",
    "custom-autograd-functions",
]

Severity = Literal["info", "warning", "error"]


class Finding(BaseModel):
    """One thing a tool found, with the specialist skill that explains the fix."""

    severity: Severity = Field(
        description="error: breaks training; warning: likely harmful; info: worth knowing"
    )
    code: str = Field(description="stable machine-readable identifier, e.g. 'nonfinite_forward'")
    message: str = Field(description="what was found and what to do next, in one or two sentences")
    skill: SkillName | None = Field(default=None, description="the skill to read next for the fix")


class BatchRule(BaseModel):
    """How the tool fed the batch to the model and where the loss came from (one rule for every tool)."""

    batch: Literal["tensor", "positional", "inputs_target", "dict", "other"] = Field(
        description="tensor: model(x); positional: model(*batch); inputs_target: the last element of a "
        "tuple the forward cannot take is the target; dict: model(**batch)"
    )
    call: str = Field(description="the call made, e.g. 'model(batch[0]), target batch[-1]'")
    loss: str | None = Field(
        default=None,
        description="where the loss came from: the user's loss, output.loss (the model's own), a "
        "target-aware default (cross-entropy, MSE) or the mean of the output; None when no loss is taken",
    )


class RunInfo(BaseModel):
    """How the user's code was run: where, how long, and what it printed."""

    device: str = Field(description="device the code ran on, e.g. 'cpu' or 'cuda:0'")
    torch_version: str
    python: str = Field(
        default="", description="the interpreter that ran the code (--python, or found in the project)"
    )
    wall_time_s: float = Field(description="seconds from fork to result inside the worker")
    cpu_threads: int | None = None  # torch intra-op threads the run used
    output: str = Field(
        default="", description="what the user's code printed (stdout and stderr), head and tail"
    )
    output_bytes: int = Field(default=0, description="total bytes the user's code printed")
    output_truncated: bool = False


_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float) -> str:
    """`format_bytes(3 * 2**30)` -> '3.00 GiB'."""
    value = float(n)
    for unit in _BYTE_UNITS:
        if abs(value) < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_seconds(s: float) -> str:
    """`format_seconds(0.0123)` -> '12.3 ms'."""
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.1f} us"


def format_number(x: float, digits: int = 3) -> str:
    """Significant digits, never rounded to nothing: 0.0123 -> '0.0123', 4.56 -> '4.56', 12345.6 -> '12,346'."""
    if x == 0 or not (abs(x) < float("inf")):
        return f"{x:g}"
    if abs(x) >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def format_flops(f: float) -> str:
    """`format_flops(2.5e12)` -> '2.50 TFLOP'."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("KFLOP", 1e3)):
        if abs(f) >= scale:
            return f"{f / scale:.2f} {unit}"
    return f"{f:.0f} FLOP"

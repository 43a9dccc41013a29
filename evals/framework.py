"""Scripted eval scenarios: a tool call plus what its structured result must say.

A scenario module under `evals/scenarios/` exports `SCENARIOS: list[Scenario]`, e.g.

    Scenario(
        id="nan-from-log-of-zero",
        tool="check_gradients",
        arguments={"model": "evals/models/buggy.py:log_of_zero", "input_shape": [4, 8]},
        expect=[Expect("nonfinite.module", "eq", "log_layer"), Expect("findings[*].code", "contains", "nonfinite_forward")],
    )

`pytest evals/` calls every scenario's tool through the MCP server and scores it. Paths in
`Expect` are dotted into the result's structured content; `[*]` collects a field over a list
(`findings[*].code`), `[0]` indexes. Scenarios are data: they never compute their own expected
values from the tool's code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Op = Literal["eq", "ne", "contains", "not_contains", "le", "ge", "between", "is_null", "not_null", "approx"]


@dataclass(frozen=True)
class Expect:
    path: str
    op: Op
    value: Any = None
    tolerance: float = 0.0  # relative, for "approx"

    def describe(self) -> str:
        return f"{self.path} {self.op} {self.value!r}" if self.value is not None else f"{self.path} {self.op}"


@dataclass(frozen=True)
class Scenario:
    id: str
    tool: str
    arguments: dict[str, Any]
    expect: list[Expect] = field(default_factory=list)
    expect_error: str | None = None  # a substring the tool error must contain, when the call must fail
    description: str = ""
    slow: bool = False
    requires: tuple[
        str, ...
    ] = ()  # importable modules (an optional extra); skipped with a reason without them
    prepare: Callable[[], object] | None = (
        None  # run once before the call (e.g. write the checkpoint it reads)
    )


_MISSING = object()


def lookup(data: Any, path: str) -> Any:
    """Follow a dotted path with `[*]` (collect over a list) and `[n]` (index) parts."""
    current: list[Any] = [data]
    collected = False
    for raw in path.split("."):
        name, _, index = raw.partition("[")
        nxt: list[Any] = []
        for item in current:
            value = (
                item.get(name, _MISSING)
                if (name and isinstance(item, dict))
                else (item if not name else _MISSING)
            )
            if value is _MISSING:
                continue
            if index:
                spec = index.rstrip("]")
                if spec == "*":
                    collected = True
                    nxt.extend(value if isinstance(value, list) else [])
                else:
                    try:
                        nxt.append(value[int(spec)])
                    except (IndexError, KeyError, TypeError, ValueError):
                        continue
            else:
                nxt.append(value)
        current = nxt
    if collected:
        return current
    return current[0] if current else None


def check(expect: Expect, result: Any) -> tuple[bool, Any]:
    """(passed, the actual value) of one expectation against a structured result."""
    actual = lookup(result, expect.path)
    op, value = expect.op, expect.value
    try:
        if op == "eq":
            ok = actual == value
        elif op == "ne":
            ok = actual != value
        elif op == "contains":
            ok = actual is not None and value in actual
        elif op == "not_contains":
            ok = actual is None or value not in actual
        elif op == "le":
            ok = actual is not None and actual <= value
        elif op == "ge":
            ok = actual is not None and actual >= value
        elif op == "between":
            ok = actual is not None and value[0] <= actual <= value[1]
        elif op == "is_null":
            ok = actual is None
        elif op == "not_null":
            ok = actual is not None
        elif op == "approx":
            ok = actual is not None and math.isclose(actual, value, rel_tol=expect.tolerance)
        else:
            raise ValueError(f"unknown op {op!r}")
    except TypeError:
        ok = False
    return ok, actual

"""Walking a loaded checkpoint: its tensors, wherever they sit, without importing torch here.

Use:

    for path, leaf in walk(obj):          # ("optimizer.state.0.exp_avg", tensor), bounded
        info = leaf_info(leaf)            # LeafInfo(shape, dtype, nbytes, kind) or None

A leaf is a torch.Tensor (also a Parameter), a numpy ndarray, or a `TensorMeta`: a tensor known
only by its header (safetensors, DCP metadata) whose bytes the worker reads on demand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 64  # deeper than any real checkpoint; a hostile one stops here
MAX_NODES = 5_000_000


@dataclass(slots=True)
class TensorMeta:
    """A tensor described by a header; `read()` materialises it, `chunks(n)` streams it."""

    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "bfloat16"
    nbytes: int
    source: str  # where its bytes live, for messages
    read: Callable[[], Any] | None = None  # -> torch.Tensor
    chunks: Callable[[int], Iterator[Any]] | None = None  # (max elements) -> 1-D torch.Tensor pieces
    # (reader, absolute offset, nbytes) when the bytes sit contiguously in a file the reader can
    # slice (`reader.span(offset, nbytes)`): lets NaN/Inf counting read many small tensors at once
    location: tuple[Any, int, int] | None = None


@dataclass(frozen=True, slots=True)
class LeafInfo:
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    kind: str  # "torch", "numpy" or "meta"


def leaf_info(value: Any) -> LeafInfo | None:
    """Shape, dtype and size of a tensor-like leaf; None for anything else."""
    if isinstance(value, TensorMeta):
        return LeafInfo(tuple(value.shape), value.dtype, value.nbytes, "meta")
    module = type(value).__module__ or ""
    if module.startswith("torch") and hasattr(value, "untyped_storage"):
        dtype = str(value.dtype).removeprefix("torch.")
        return LeafInfo(tuple(value.shape), dtype, value.numel() * value.element_size(), "torch")
    if module.startswith("numpy") and any(c.__name__ == "ndarray" for c in type(value).__mro__):  # memmap too
        return LeafInfo(tuple(value.shape), f"numpy.{value.dtype.name}", int(value.nbytes), "numpy")
    return None


def is_tensor_mapping(value: Any) -> bool:
    """A non-empty mapping from str keys to tensor-like values: a state dict."""
    if not isinstance(value, Mapping) or not value:
        return False
    return all(isinstance(k, str) for k in value) and all(leaf_info(v) is not None for v in value.values())


def walk(
    obj: Any, prefix: str = "", max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES
) -> Iterator[tuple[str, Any]]:
    """(dotted path, leaf) for every tensor-like leaf, depth-first, within the bounds.

    Each container is entered once (a visited set of ids), so a list that holds itself or a
    billion-laughs pickle (containers shared through the memo) costs their size, not their paths.
    Leaves are not deduplicated: tied weights appear under each of their names.
    """
    stack: list[tuple[str, Any, int]] = [(prefix, obj, 0)]
    entered: set[int] = set()
    seen = 0
    while stack:
        path, value, depth = stack.pop()
        seen += 1
        if seen > max_nodes:
            return
        if leaf_info(value) is not None:
            yield path, value
            continue
        if depth >= max_depth:
            continue
        if isinstance(value, (Mapping, list, tuple)):
            if id(value) in entered:
                continue
            entered.add(id(value))
        if isinstance(value, Mapping):
            items = list(value.items())
        elif isinstance(value, (list, tuple)):
            items = list(enumerate(value))
        else:
            continue
        for key, child in reversed(items):
            stack.append((f"{path}.{key}" if path else str(key), child, depth + 1))

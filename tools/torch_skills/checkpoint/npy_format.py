"""Read a numpy `.npy` header without numpy, and say whether the array holds pickled objects.

Use:

    header = read_npy_header(first_bytes)      # the file's (or zip member's) first bytes
    header.ok, header.problem                  # parsed, or why not
    header.has_object                          # dtype holds Python objects: the data is a pickle
    header.data_offset                         # where the array bytes (or that pickle) begin

Format (numpy/lib/format.py): the magic `\\x93NUMPY`, a major and a minor version byte, the header
length (2 bytes little-endian for version 1, 4 bytes for 2 and 3), then a Python dict literal
`{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }` padded with spaces. An array whose
dtype holds objects (`|O`, or a structured dtype with an `O` field) is written as a pickle after
the header, and `np.load(allow_pickle=True)` unpickles it; any other dtype is raw bytes.
The dict is parsed with `ast.literal_eval` after a length check (numpy's own cap is 10,000 bytes
unless the caller raises it), never with eval and never with numpy.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

MAGIC = b"\x93NUMPY"
MAX_HEADER_BYTES = 1 << 20  # numpy reads up to 10,000 by default; a larger one is refused here too


@dataclass
class NpyHeader:
    ok: bool
    problem: str | None = None
    version: tuple[int, int] | None = None
    descr: Any = None
    shape: tuple[int, ...] | None = None
    fortran_order: bool | None = None
    data_offset: int = 0
    has_object: bool = False
    itemsize: int | None = None  # bytes per element, when the descr is simple enough to size

    @property
    def nbytes(self) -> int | None:
        if self.itemsize is None or self.shape is None:
            return None
        n = self.itemsize
        for d in self.shape:
            n *= d
        return n


def _has_object(descr: Any, depth: int = 0) -> bool:
    """True when any field of the descr is an object dtype (conservative on anything odd)."""
    if depth > 32:
        return True
    if isinstance(descr, str):
        return descr.lstrip("<>|=!").startswith("O")
    if isinstance(descr, (list, tuple)):
        return any(_has_object(part, depth + 1) for part in descr)
    if isinstance(descr, dict):
        return any(_has_object(v, depth + 1) for v in descr.values())
    return not isinstance(descr, (int, type(None)))


def _itemsize(descr: Any) -> int | None:
    if not isinstance(descr, str):
        return None
    body = descr.lstrip("<>|=!")
    kind, digits = body[:1], body[1:]
    if not digits.isdigit():
        return None
    n = int(digits)
    return n * 4 if kind == "U" else n


def read_npy_header(head: bytes) -> NpyHeader:
    """Parse the header at the start of `head` (pass at least the first 64 KiB, or all of it)."""
    if head[:6] != MAGIC:
        return NpyHeader(False, "no .npy magic")
    if len(head) < 10:
        return NpyHeader(False, "truncated before the header length")
    major, minor = head[6], head[7]
    if major == 1:
        length, start = int.from_bytes(head[8:10], "little"), 10
    elif major in (2, 3):
        if len(head) < 12:
            return NpyHeader(False, "truncated before the header length")
        length, start = int.from_bytes(head[8:12], "little"), 12
    else:
        return NpyHeader(False, f"unknown .npy format version {major}.{minor}")
    if length > MAX_HEADER_BYTES:
        return NpyHeader(False, f"the header claims {length} bytes (limit {MAX_HEADER_BYTES})")
    if start + length > len(head):
        return NpyHeader(False, f"the header claims {length} bytes but the data ends first")
    encoding = "utf-8" if major == 3 else "latin-1"
    try:
        text = head[start : start + length].decode(encoding)
        value = ast.literal_eval(text)
    except (UnicodeDecodeError, ValueError, SyntaxError, MemoryError, RecursionError, TypeError) as e:
        return NpyHeader(False, f"the header is not a Python literal ({type(e).__name__})")
    if not isinstance(value, dict) or not {"descr", "fortran_order", "shape"} <= set(value):
        return NpyHeader(False, "the header lacks descr, fortran_order or shape")
    shape = value["shape"]
    if not isinstance(shape, tuple) or not all(type(d) is int and d >= 0 for d in shape):
        return NpyHeader(False, f"shape {str(shape)[:60]} is not a tuple of non-negative integers")
    descr = value["descr"]
    return NpyHeader(
        True,
        version=(major, minor),
        descr=descr,
        shape=shape,
        fortran_order=bool(value["fortran_order"]),
        data_offset=start + length,
        has_object=_has_object(descr),
        itemsize=_itemsize(descr),
    )

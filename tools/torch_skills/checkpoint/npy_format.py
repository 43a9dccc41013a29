"""Read a numpy `.npy` header without numpy, and say whether the array holds pickled objects.

Use:

    header = read_npy_header(first_bytes)      # the file's (or zip member's) first bytes
    header.ok, header.problem                  # parsed, or why not
    header.has_object                          # dtype holds Python objects: the data is a pickle
    header.data_offset                         # where the array bytes (or that pickle) begin

Format (numpy/lib/format.py): the magic `\\x93NUMPY`, a major and a minor version byte, the header
length (2 bytes little-endian for version 1, 4 bytes for 2 and 3), then a Python dict literal
`{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }` padded with spaces. An array whose
dtype holds objects is written as a pickle after the header, and `np.load(allow_pickle=True)`
unpickles it; any other dtype is raw bytes. Whether it holds objects is decided the way numpy
decides it: `numpy.lib.format.descr_to_dtype(descr).hasobject`, so every spelling counts ('O',
'object', 'f4,O', '(2,)O', '2O', numpy 2's 'T' strings, structured fields, format 3.0's UTF-8
headers); building a dtype from a string runs no code. Without numpy, a descr that is not made
only of plain scalar types counts as holding objects. The dict is parsed with `ast.literal_eval`
after a length check (numpy lifts its own 10,000-byte cap when allow_pickle=True, so a larger
header is refused here, never called safe), retried with Python 2's `10L` integers made plain
for format 1.0 and 2.0 as numpy does; never with eval.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import warnings
from dataclasses import dataclass
from typing import Any

from torch_skills.checkpoint.problems import Problem

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
    itemsize: int | None = None  # bytes per element (numpy's dtype.itemsize), when numpy could size it
    too_large: bool = False  # the header is over MAX_HEADER_BYTES: not parsed, may still hold objects

    @property
    def nbytes(self) -> int | None:
        if self.itemsize is None or self.shape is None:
            return None
        n = self.itemsize
        for d in self.shape:
            n *= d
        return n


# dtype strings made only of plain scalar types ('<f4', 'i8,u1', '(2,3)f4', 'U10', 'M8[s]'): the
# fallback when numpy cannot be imported; anything else counts as holding objects
_PLAIN_SCALAR = re.compile(
    r"\s*(\(\s*\d+\s*(,\s*\d+\s*)*,?\s*\)|\d+)?\s*[<>|=]?"
    r"([?bBhHiIlLqQpPefdgFDG]|b1|[iuf]\d{1,2}|c\d{1,2}|[USV]\d{0,10}|[mM]8(\[\w+\])?)\s*"
)


def _has_object_without_numpy(descr: Any, depth: int = 0) -> bool:
    """Conservative: True unless every part is a plain scalar type numpy could only read as bytes."""
    if depth > 32:
        return True
    if isinstance(descr, str):
        return not all(_PLAIN_SCALAR.fullmatch(part) for part in descr.split(","))
    if isinstance(descr, tuple) and len(descr) == 2:
        return _has_object_without_numpy(descr[0], depth + 1)
    if isinstance(descr, list):
        return any(
            not isinstance(f, tuple) or len(f) not in (2, 3) or _has_object_without_numpy(f[1], depth + 1)
            for f in descr
        )
    return True


def dtype_facts(descr: Any) -> tuple[bool, int | None, str | None]:
    """(holds objects, item size, why numpy refuses it) for a header's descr, decided the way np.load
    decides it: numpy.lib.format.descr_to_dtype(descr).hasobject. A dtype numpy cannot build is
    refused by np.load before any byte is unpickled."""
    try:
        from numpy.lib.format import descr_to_dtype
    except ImportError:
        return _has_object_without_numpy(descr), None, None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dtype = descr_to_dtype(descr)
    except RecursionError:
        return True, None, None
    except Exception as e:  # noqa: BLE001 - np.load raises the same and unpickles nothing
        return False, None, f"numpy cannot build its dtype ({type(e).__name__})"
    return bool(dtype.hasobject), (None if dtype.hasobject else int(dtype.itemsize)), None


def _filter_python2_longs(text: str) -> str:
    """The header with Python 2's `10L` integers made plain, as numpy does for format 1.0 and 2.0."""
    tokens = []
    last_number = False
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if last_number and token.type == tokenize.NAME and token.string == "L":
            continue
        tokens.append(token)
        last_number = token.type == tokenize.NUMBER
    return tokenize.untokenize(tokens)


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
        # np.load(allow_pickle=True) lifts numpy's own header cap, so this may still be loaded
        return NpyHeader(
            False, f"the header claims {length} bytes (limit {MAX_HEADER_BYTES})", too_large=True
        )
    if start + length > len(head):
        return NpyHeader(False, f"the header claims {length} bytes but the data ends first")
    encoding = "utf-8" if major == 3 else "latin-1"
    try:
        text = head[start : start + length].decode(encoding)
        try:
            value = ast.literal_eval(text)
        except SyntaxError:
            if major == 3:
                raise
            value = ast.literal_eval(_filter_python2_longs(text))
    except (UnicodeDecodeError, ValueError, SyntaxError, MemoryError, RecursionError, TypeError) as e:
        return NpyHeader(False, f"the header is not a Python literal ({type(e).__name__})")
    except tokenize.TokenError as e:
        return NpyHeader(False, f"the header is not a Python literal ({type(e).__name__})")
    if not isinstance(value, dict) or not {"descr", "fortran_order", "shape"} <= set(value):
        return NpyHeader(False, "the header lacks descr, fortran_order or shape")
    shape = value["shape"]
    # numpy checks isinstance(x, int): negative sizes and booleans pass, and an object array's
    # pickle is loaded before the shape is used
    if not isinstance(shape, tuple) or not all(isinstance(d, int) for d in shape):
        return NpyHeader(False, f"shape {str(shape)[:60]} is not a tuple of integers")
    descr = value["descr"]
    has_object, itemsize, refused = dtype_facts(descr)
    if refused:
        return NpyHeader(False, refused)
    sized = all(d >= 0 for d in shape)
    return NpyHeader(
        True,
        version=(major, minor),
        descr=descr,
        shape=shape if sized else None,
        fortran_order=bool(value["fortran_order"]),
        data_offset=start + length,
        has_object=has_object,
        itemsize=itemsize,
    )


def header_problem(header: NpyHeader, source: str) -> Problem:
    """The problem to report for a header that did not parse."""
    if header.too_large:
        return Problem(
            "npy_header_too_large",
            source,
            f"the .npy header is too large to check ({header.problem}); np.load(allow_pickle=True) still reads "
            "it, so the file cannot be called safe",
        )
    return Problem("corrupt_npy", source, f"corrupt/unreadable .npy header: {header.problem}")

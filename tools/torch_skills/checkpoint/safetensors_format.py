"""Read safetensors headers (and their sharded index files) treating every number as hostile.

Use:

    header = read_safetensors_header("model.safetensors")
    header.tensors     # [SafeTensorEntry(name, dtype, shape, begin, end)], offsets relative to data
    header.problems    # Problem(...) for a lying or oversized header
    for chunk in iter_tensor_bytes(path, header, entry, chunk_bytes=1 << 24): ...

    index = read_safetensors_index("model.safetensors.index.json")   # weight_map, shard files

The format: 8-byte little-endian header length N, N bytes of JSON
`{"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, "__metadata__": {...}}`,
then the data; offsets count from the end of the header. Checked here: N against the safetensors
library's own cap (100,000,000 bytes, MAX_HEADER_SIZE in safetensors/src/tensor.rs) and the file
size, JSON that parses to an object with no duplicate keys, known dtypes, non-negative integer
shapes, `end - begin == numel * itemsize`, offsets inside the file, no overlapping ranges; gaps
are reported as a warning (the reference reader refuses them too). No third-party package needed.

Cost: the usual layout (what safetensors writers emit) is read by one pattern split and checked in
bulk over columns, with the garbage collector paused; `header.tensors` is built on first use. A
500,000-entry header then costs about 1.2-1.4x a bare `json.loads` of it with the collector paused
(bench/scan_cost.py). Known limitations: any other layout (`__metadata__` last, other key order),
and any header with a bad entry, a gap or an overlap, is checked entry by entry: 3-5x `json.loads`
at that size, linear in any case.
"""

from __future__ import annotations

import gc
import json
import math
import operator
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch_skills.checkpoint.problems import Problem

MAX_HEADER_BYTES = 100_000_000  # safetensors/src/tensor.rs MAX_HEADER_SIZE
MAX_DIMS = 64

# safetensors dtype -> bytes per element (safetensors/src/tensor.rs Dtype::size)
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "C64": 8,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}
# safetensors dtype -> torch dtype name (for reporting and for torch.frombuffer in the worker)
TORCH_DTYPE = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "C64": "complex64",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
}


@dataclass(slots=True)
class SafeTensorEntry:
    name: str
    dtype: str  # safetensors spelling, e.g. "BF16"
    shape: list[int]
    begin: int  # relative to the start of the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def torch_dtype(self) -> str:
        return TORCH_DTYPE[self.dtype]


@dataclass(slots=True)
class _Columns:
    """The header's entries as parallel lists (index i is one tensor): what the bulk checks read."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    begins: list[int]
    ends: list[int]


@dataclass
class SafetensorsHeader:
    source: str
    size: int
    header_bytes: int = 0
    data_offset: int = 0  # absolute offset of the data section
    metadata: dict[str, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    # the checked entries, kept as columns until someone asks for `tensors` (a 500,000-entry header
    # would otherwise cost as many objects before the verdict needs any of them)
    _columns: _Columns | None = field(default=None, repr=False)
    _tensors: list[SafeTensorEntry] | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return not any(p.blocks_safe for p in self.problems)

    @property
    def tensors(self) -> list[SafeTensorEntry]:
        """[SafeTensorEntry] in header order, built on first use."""
        if self._tensors is None:
            c = self._columns
            self._tensors = (
                [] if c is None else list(map(SafeTensorEntry, c.names, c.dtypes, c.shapes, c.begins, c.ends))
            )
            self._columns = None
        return self._tensors

    @property
    def tensor_names(self) -> list[str]:
        """The tensors' names in header order, without building the entries."""
        return list(self._columns.names) if self._columns is not None else [t.name for t in self.tensors]


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # rare: find the name for the message
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


_STRICT_JSON = json.JSONDecoder(object_pairs_hook=_no_duplicates)  # what the full parser applies


_JSON_SPACE = " \t\n\r"


def _entry_pattern(possessive: bool) -> re.Pattern[str]:
    """`, "name": {"dtype": ..., "shape": [...], "data_offsets": [b, e]}`: one entry with the comma before it.

    Five groups: name (the JSON string's inside, still escaped), dtype, shape's inside, begin, end.
    Starting at the comma keeps a failed search linear: it retries only where a comma, spaces and a
    quote begin, and a name's scan from there ends at the next such start (a quote after a comma or
    space cannot be escaped). The name is one greedy run between escapes: no per-character
    alternation. Every run is followed by a character it cannot take, so making the runs
    possessive (Python 3.11+) matches the same text and only spares the matcher its backtracking
    bookkeeping (about a fifth of its time).
    """
    more = "+" if possessive else ""
    ws = "[ \t\n\r]*" + more  # JSON's own whitespace: `\s` would also take \v, \f and Unicode spaces
    num = "(?:0|[1-9][0-9]{0,19}" + more + ")"
    name = '[^"\\\\\\x00-\\x1f]*' + more + '(?:\\\\.[^"\\\\\\x00-\\x1f]*' + more + ")*" + more
    return re.compile(
        "," + ws + '"(' + name + ')"' + ws + ":" + ws + r"\{" + ws + r'"dtype"' + ws + ":" + ws
        + r'"([A-Z0-9_]{1,16})"' + ws + "," + ws + r'"shape"' + ws + ":" + ws
        + r"\[(" + ws + "(?:" + num + ws + "(?:," + ws + num + ws + "){0,63})?)\\]" + ws + "," + ws
        + r'"data_offsets"' + ws + ":" + ws + r"\[" + ws + "(" + num + ")" + ws + "," + ws
        + "(" + num + ")" + ws + r"\]" + ws + r"\}" + ws
    )  # fmt: skip


_ENTRY = _entry_pattern(possessive=sys.version_info >= (3, 11))
_GROUPS = 5
_DTYPE_NAMES = {name: name for name in DTYPE_BYTES}  # one shared string per dtype
_METADATA_KEY = re.compile(r'[ \t\n\r]*"__metadata__"[ \t\n\r]*:[ \t\n\r]*')


def _fast_header(raw: bytes) -> tuple[_Columns, Any] | None:
    """The header's entries as columns, and its __metadata__, when laid out the usual way; else None.

    safetensors writers emit one flat object: an optional `"__metadata__"` first, then
    `"name": {"dtype", "shape", "data_offsets"}` entries in that key order. One `split` by a
    compiled pattern reads them all in C: each match is one entry with the comma before it (one is
    added before the first), and the text between matches must be empty, so the matches tile the
    body exactly (nothing skipped, no missing or trailing comma). The groups land in one flat list
    whose slices are the columns; names with escapes, shapes and offsets are parsed in bulk. Any
    other layout returns None and goes through the full JSON parser, which says what is wrong.
    """
    try:
        body = raw.decode("utf-8").rstrip(" ")  # each step below drops the previous copy
    except UnicodeDecodeError:
        return None
    if not body.startswith("{") or not body.endswith("}"):
        return None
    body = body[1:-1]
    metadata: Any = None
    meta = _METADATA_KEY.match(body)
    if meta is not None:
        try:
            metadata, after = _STRICT_JSON.raw_decode(body, meta.end())
        except (ValueError, RecursionError):  # _DuplicateKey included: the full parser names it
            return None
        body = body[after:].lstrip(_JSON_SPACE)  # the entries' text, starting with a comma
    else:
        body = "," + body if body.strip(_JSON_SPACE) else ""  # so that every entry starts with a comma
    if not body:
        return _Columns([], [], [], [], []), metadata
    parts = _ENTRY.split(body)
    escaped = "\\" in body  # only names can hold a backslash here
    del body
    if len(parts) == 1 or any(parts[:: _GROUPS + 1]):
        return None  # text between (or around) the entries that the pattern did not take
    names = parts[1 :: _GROUPS + 1]
    dtypes = list(map(_DTYPE_NAMES.get, parts[2 :: _GROUPS + 1], parts[2 :: _GROUPS + 1]))
    shapes_text = parts[3 :: _GROUPS + 1]
    begins_text, ends_text = parts[4 :: _GROUPS + 1], parts[5 :: _GROUPS + 1]
    del parts
    try:
        if escaped:  # decode the names' escapes as JSON does
            names = json.loads('["' + '","'.join(names) + '"]')
        # the pattern let through only digits, commas and whitespace: each shape is a JSON list
        shapes = json.loads("[[" + "],[".join(shapes_text) + "]]")
    except (ValueError, RecursionError):
        return None
    return _Columns(names, dtypes, shapes, list(map(int, begins_text)), list(map(int, ends_text))), metadata


def _columns_pass(columns: _Columns, data_size: int) -> bool:
    """True when every entry is well formed and the tensors tile the data section exactly.

    Run in C over whole columns (the fast path's pattern already holds every number to
    non-negative decimal digits and every shape to at most 64 of them): known dtypes, each span
    `end - begin` equal to numel * itemsize (which also makes it non-negative), every end inside
    the data, and, in offset order, each tensor starting where the previous one ended, the first
    at 0 and the last ending at the data's end (no overlap, no gap, no trailing bytes). False means
    some entry needs the per-entry checks, which name what is wrong.
    """
    sizes = list(map(DTYPE_BYTES.get, columns.dtypes))
    if None in sizes:
        return False
    begins, ends = columns.begins, columns.ends
    if list(map(operator.mul, map(math.prod, columns.shapes), sizes)) != list(
        map(operator.sub, ends, begins)
    ):
        return False
    if not begins:
        return True
    if max(ends) > data_size:
        return False
    if begins[0] == 0 and begins[1:] == ends[:-1] and ends[-1] == data_size:
        return True  # already in offset order
    if len(begins) == 1:
        return False
    order = sorted(range(len(begins)), key=begins.__getitem__)
    begins, ends = operator.itemgetter(*order)(begins), operator.itemgetter(*order)(ends)
    return begins[0] == 0 and begins[1:] == ends[:-1] and ends[-1] == data_size


def _distinct_tensor_names(names: list[str]) -> bool:
    distinct = set(names)
    return len(distinct) == len(names) and "__metadata__" not in distinct


def _is_int(value: Any) -> bool:
    return type(value) is int


def read_safetensors_header(path: str | os.PathLike, source: str | None = None) -> SafetensorsHeader:
    """Parse and validate the header; every inconsistency becomes a Problem, never an exception."""
    source = source or os.fspath(path)
    size = os.path.getsize(path)
    result = SafetensorsHeader(source=source, size=size)

    def problem(code: str, message: str, **kw) -> SafetensorsHeader:
        result.problems.append(Problem(code, source, message, **kw))
        return result

    if size < 8:
        return problem("safetensors_truncated", f"{size} bytes: too short for the 8-byte header length")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > MAX_HEADER_BYTES:
            return problem(
                "safetensors_header_too_large",
                f"the header claims {n} bytes; the safetensors cap is {MAX_HEADER_BYTES} (a hostile or "
                "corrupt file)",
            )
        if n > size - 8:
            return problem(
                "safetensors_header_beyond_file",
                f"the header claims {n} bytes but only {size - 8} follow the length field",
            )
        raw = f.read(n)
    result.header_bytes = n
    result.data_offset = 8 + n
    with _collector_paused():
        fast = _fast_header(raw)
        if fast is not None and _distinct_tensor_names(fast[0].names):
            return _finish_columns(result, *fast, size, problem)
    del fast  # not the usual layout, or a name twice: the full parser says which
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        return problem(
            "safetensors_duplicate_key",
            f"the header names {e} twice; readers disagree on which entry wins",
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return problem("safetensors_bad_header", f"the header is not valid JSON: {str(e)[:200]}")
    if not isinstance(header, dict):
        return problem("safetensors_bad_header", "the header is not a JSON object")
    meta = header.pop("__metadata__", None)
    return _finish_header(result, list(header.items()), meta, size, problem)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector, restoring its state whatever happens.

    The fast path allocates a few hundred thousand lists that can hold no cycle; each allocation
    otherwise counts towards a collection that walks every live object, which would cost more than
    the parse itself.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _set_metadata(result: SafetensorsHeader, meta: Any, problem) -> None:
    if meta is not None:
        if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
        ):
            problem("safetensors_bad_metadata", "__metadata__ must map strings to strings")
        else:
            result.metadata = meta


def _finish_columns(
    result: SafetensorsHeader, columns: _Columns, meta: Any, size: int, problem
) -> SafetensorsHeader:
    """Keep the fast path's columns when they pass in bulk; else check entry by entry (same messages)."""
    if _columns_pass(columns, size - result.data_offset):
        _set_metadata(result, meta, problem)
        result._columns = columns
        return result
    c = columns
    pairs = list(zip(c.names, zip(c.dtypes, c.shapes, c.begins, c.ends, strict=True), strict=True))
    return _finish_header(result, pairs, meta, size, problem)


def _finish_header(
    result: SafetensorsHeader, pairs: list, meta: Any, size: int, problem
) -> SafetensorsHeader:
    data_size = size - result.data_offset
    _set_metadata(result, meta, problem)
    pairs.reverse()  # consumed from the end so each pair is freed once its entry exists
    while pairs:
        name, spec = pairs.pop()
        entry = _entry(name, spec, data_size, result)
        if entry is not None:
            result.tensors.append(entry)
    _check_layout(result, data_size)
    return result


_SPEC_KEYS = frozenset({"dtype", "shape", "data_offsets"})


def _entry(name: str, spec: Any, data_size: int, result: SafetensorsHeader) -> SafeTensorEntry | None:
    """Check one entry: `spec` is the JSON object, or (dtype, shape, begin, end) from the fast path."""

    def bad(code: str, message: str) -> None:
        if len(result.problems) < 200:  # a hostile header could hold a million bad entries
            result.problems.append(Problem(code, f"{result.source}::{name}", message))
        elif len(result.problems) == 200:
            result.problems.append(
                Problem("safetensors_many_bad_entries", result.source, "more bad entries follow")
            )

    if type(spec) is tuple:
        dtype, shape, begin, end = spec
    else:
        if type(spec) is not dict or len(spec) != 3 or spec.keys() != _SPEC_KEYS:
            bad("safetensors_bad_entry", "needs exactly dtype, shape and data_offsets")
            return None
        dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
        if (
            type(offsets) is not list
            or len(offsets) != 2
            or type(offsets[0]) is not int
            or type(offsets[1]) is not int
            or offsets[0] < 0
        ):
            bad("safetensors_bad_offsets", "data_offsets must be two non-negative integers")
            return None
        begin, end = offsets
    itemsize = DTYPE_BYTES.get(dtype) if type(dtype) is str else None
    if itemsize is None:
        bad("safetensors_bad_dtype", f"unknown dtype {str(dtype)[:40]!r}")
        return None
    numel = 1
    if type(shape) is not list or len(shape) > MAX_DIMS:
        bad("safetensors_bad_shape", f"shape must be up to {MAX_DIMS} non-negative integers")
        return None
    for d in shape:
        if type(d) is not int or d < 0:
            bad("safetensors_bad_shape", f"shape must be up to {MAX_DIMS} non-negative integers")
            return None
        numel *= d
    if begin > end:
        bad("safetensors_bad_offsets", f"data_offsets [{begin}, {end}] run backwards")
        return None
    if end > data_size:
        bad(
            "safetensors_offsets_beyond_file",
            f"data_offsets end at {end} but the data section holds {data_size} bytes",
        )
        return None
    if numel * itemsize != end - begin:
        bad(
            "safetensors_size_mismatch",
            f"{dtype} {shape} needs {numel * itemsize} bytes but data_offsets span {end - begin}",
        )
        return None
    return SafeTensorEntry(name, dtype, shape, begin, end)


def _check_layout(result: SafetensorsHeader, data_size: int) -> None:
    ordered = sorted(result.tensors, key=lambda t: (t.begin, t.end))
    covered = 0
    overlaps = 0
    for previous, current in zip(ordered, ordered[1:], strict=False):
        if current.begin < previous.end and overlaps < 20:
            overlaps += 1
            result.problems.append(
                Problem(
                    "safetensors_offsets_overlap",
                    f"{result.source}::{current.name}",
                    f"bytes {current.begin}..{current.end} overlap {previous.name} ({previous.begin}..{previous.end})",
                )
            )
    gaps = 0
    for t in ordered:
        if t.begin > covered and gaps < 20:
            gaps += 1
            result.problems.append(
                Problem(
                    "safetensors_gap",
                    f"{result.source}::{t.name}",
                    f"{t.begin - covered} unused bytes before this tensor; the reference reader rejects gaps",
                    severity="warning",
                    blocks_safe=False,
                )
            )
        covered = max(covered, t.end)
    if ordered and covered < data_size:
        result.problems.append(
            Problem(
                "safetensors_trailing_bytes",
                result.source,
                f"{data_size - covered} bytes after the last tensor belong to no tensor",
                severity="warning",
                blocks_safe=False,
            )
        )


def iter_tensor_bytes(
    path: str | os.PathLike, header: SafetensorsHeader, entry: SafeTensorEntry, chunk_bytes: int
) -> Iterator[bytes]:
    """The tensor's bytes in chunks of at most `chunk_bytes` (a multiple of its element size)."""
    itemsize = DTYPE_BYTES[entry.dtype]
    step = max(itemsize, chunk_bytes - chunk_bytes % itemsize)
    with open(path, "rb") as f:
        f.seek(header.data_offset + entry.begin)
        remaining = entry.nbytes
        while remaining > 0:
            chunk = f.read(min(step, remaining))
            if not chunk:
                raise OSError(f"{path} ended early while reading {entry.name}")
            remaining -= len(chunk)
            yield chunk


@dataclass
class SafetensorsIndex:
    source: str
    weight_map: dict[str, str] = field(default_factory=dict)
    shards: list[str] = field(default_factory=list)
    total_size: int | None = None
    problems: list[Problem] = field(default_factory=list)


def read_safetensors_index(path: str | os.PathLike, max_bytes: int = 64 << 20) -> SafetensorsIndex:
    """Parse a `*.index.json` (sharded weights): weight_map must name plain files beside it."""
    path = Path(path)
    result = SafetensorsIndex(source=str(path))

    def problem(code: str, message: str, **kw) -> SafetensorsIndex:
        result.problems.append(Problem(code, str(path), message, **kw))
        return result

    size = path.stat().st_size
    if size > max_bytes:
        return problem("index_too_large", f"{size} bytes; an index over {max_bytes} bytes is not plausible")
    try:
        data = json.loads(path.read_text("utf-8"), object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        return problem("index_duplicate_key", f"the index names {e} twice")
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return problem("index_bad_json", f"not valid JSON: {str(e)[:200]}")
    if not isinstance(data, dict) or not isinstance(data.get("weight_map"), dict):
        return problem("index_bad_json", "no weight_map object")
    meta = data.get("metadata")
    if isinstance(meta, dict) and _is_int(meta.get("total_size")):
        result.total_size = meta["total_size"]
    shards: dict[str, None] = {}
    for name, shard in data["weight_map"].items():
        if not isinstance(shard, str) or not shard:
            problem("index_bad_shard", f"{name!r} maps to {shard!r}, not a file name")
            continue
        if "/" in shard or "\\" in shard or shard in (".", "..") or shard.startswith("~"):
            problem(
                "index_shard_outside_folder",
                f"{name!r} maps to {shard!r}; shard names must be plain files beside the index "
                "(a path could make a loader read any file)",
            )
            continue
        result.weight_map[name] = shard
        shards.setdefault(shard, None)
    result.shards = list(shards)
    return result

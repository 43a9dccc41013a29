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
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
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


@dataclass
class SafetensorsHeader:
    source: str
    size: int
    header_bytes: int = 0
    data_offset: int = 0  # absolute offset of the data section
    tensors: list[SafeTensorEntry] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(p.blocks_safe for p in self.problems)


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


_NUM = rb"(?:0|[1-9][0-9]{0,19})"
_ENTRY = re.compile(
    rb'(\s*"((?:[^"\\\x00-\x1f]|\\.)*)"\s*:\s*\{\s*"dtype"\s*:\s*"([A-Z0-9_]{1,16})"\s*,\s*"shape"\s*:\s*'
    rb"\[\s*((?:" + _NUM + rb"\s*(?:,\s*" + _NUM + rb"\s*){0,63})?)\]\s*,\s*"
    rb'"data_offsets"\s*:\s*\[\s*(' + _NUM + rb")\s*,\s*(" + _NUM + rb")\s*\]\s*\}\s*,?)"
)
_DTYPE_NAMES = {name.encode(): name for name in DTYPE_BYTES}
_METADATA_KEY = re.compile(rb'\s*"__metadata__"\s*:\s*')


def _fast_header(raw: bytes) -> tuple[list[tuple[str, Any]], Any] | None:
    """The header's (name, (dtype, shape, begin, end)) pairs and __metadata__ when laid out the usual way.

    safetensors writers emit one flat object: an optional `"__metadata__"` first, then
    `"name": {"dtype", "shape", "data_offsets"}` entries in that key order. One `findall` of a
    compiled pattern reads them all in C; the matches are accepted only if they tile the body
    exactly (non-overlapping matches whose lengths add up to the body's length leave no gap), so
    nothing is skipped. A 500,000-entry header then costs well under a second. Any other layout
    returns None and goes through the full JSON parser.
    """
    body = raw.rstrip(b" ")
    if not body.startswith(b"{") or not body.endswith(b"}"):
        return None
    body = body[1:-1]
    metadata: Any = None
    meta = _METADATA_KEY.match(body)
    if meta is not None:
        try:
            text = body.decode("utf-8")
            metadata, after = json.JSONDecoder().raw_decode(text, meta.end())
        except (UnicodeDecodeError, ValueError, RecursionError):
            return None
        if len(text) != len(body):
            return None  # multi-byte characters: str and bytes offsets differ
        rest = body[after:].lstrip()
        if rest and not rest.startswith(b","):
            return None
        body = rest[1:]
    if not body.strip():
        return [], metadata
    found = _ENTRY.findall(body)
    if sum(len(m[0]) for m in found) != len(body) or not found or found[-1][0].rstrip().endswith(b","):
        return None
    pairs: list[tuple[str, Any]] = []
    append = pairs.append
    found.reverse()  # popped one by one below, so each match is freed as soon as it is read
    try:
        while found:
            _, name, dtype, shape, begin, end = found.pop()
            text = name.decode("utf-8") if b"\\" not in name else json.loads(b'"' + name + b'"')
            if b"," in shape:
                dims = [int(d) for d in shape.split(b",")]
            else:
                dims = [int(shape)] if shape.strip() else []
            append((text, (_DTYPE_NAMES.get(dtype, dtype.decode()), dims, int(begin), int(end))))
    except (UnicodeDecodeError, ValueError):
        return None
    return pairs, metadata


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
    fast = _fast_header(raw)
    if fast is not None:
        pairs, meta = fast
        names = {name for name, _ in pairs}
        if len(names) != len(pairs) or "__metadata__" in names:
            fast = None  # duplicates: the full parser names the key
        else:
            del names
            return _finish_header(result, pairs, meta, size, problem)
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


def _finish_header(
    result: SafetensorsHeader, pairs: list, meta: Any, size: int, problem
) -> SafetensorsHeader:
    data_size = size - result.data_offset
    if meta is not None:
        if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
        ):
            problem("safetensors_bad_metadata", "__metadata__ must map strings to strings")
        else:
            result.metadata = meta
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

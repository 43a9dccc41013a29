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


@dataclass
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
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


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
    data_size = size - result.data_offset
    meta = header.pop("__metadata__", None)
    if meta is not None:
        if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
        ):
            problem("safetensors_bad_metadata", "__metadata__ must map strings to strings")
        else:
            result.metadata = meta
    for name, spec in header.items():
        entry = _entry(name, spec, data_size, result)
        if entry is not None:
            result.tensors.append(entry)
    _check_layout(result, data_size)
    return result


def _entry(name: str, spec: Any, data_size: int, result: SafetensorsHeader) -> SafeTensorEntry | None:
    def bad(code: str, message: str) -> None:
        result.problems.append(Problem(code, f"{result.source}::{name}", message))

    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
        bad("safetensors_bad_entry", "needs exactly dtype, shape and data_offsets")
        return None
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if dtype not in DTYPE_BYTES:
        bad("safetensors_bad_dtype", f"unknown dtype {str(dtype)[:40]!r}")
        return None
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_int(d) and d >= 0 for d in shape):
        bad("safetensors_bad_shape", f"shape must be up to {MAX_DIMS} non-negative integers")
        return None
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) and o >= 0 for o in offsets):
        bad("safetensors_bad_offsets", "data_offsets must be two non-negative integers")
        return None
    begin, end = offsets
    if begin > end:
        bad("safetensors_bad_offsets", f"data_offsets [{begin}, {end}] run backwards")
        return None
    if end > data_size:
        bad(
            "safetensors_offsets_beyond_file",
            f"data_offsets end at {end} but the data section holds {data_size} bytes",
        )
        return None
    numel = 1
    for d in shape:
        numel *= d
    if numel * DTYPE_BYTES[dtype] != end - begin:
        bad(
            "safetensors_size_mismatch",
            f"{dtype} {shape} needs {numel * DTYPE_BYTES[dtype]} bytes but data_offsets span {end - begin}",
        )
        return None
    return SafeTensorEntry(name, dtype, list(shape), begin, end)


def _check_layout(result: SafetensorsHeader, data_size: int) -> None:
    ordered = sorted(result.tensors, key=lambda t: (t.begin, t.end))
    covered = 0
    for previous, current in zip(ordered, ordered[1:], strict=False):
        if current.begin < previous.end:
            result.problems.append(
                Problem(
                    "safetensors_offsets_overlap",
                    f"{result.source}::{current.name}",
                    f"bytes {current.begin}..{current.end} overlap {previous.name} ({previous.begin}..{previous.end})",
                )
            )
    for t in ordered:
        if t.begin > covered:
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

"""Torch Distributed Checkpoint (DCP) folders: scan `.metadata`, then every item in the `.distcp` files.

Use:

    scan = scan_dcp_dir(Path("ckpt/step_100"), policy)
    scan.files            # FileScan for each .metadata and .distcp file
    scan.metadata         # DcpMetadata (tensors, bytes items, where each item lives) or None

A DCP folder holds `.metadata`, a pickle that `FileSystemReader.read_metadata` loads with plain
`pickle.load`, and `__<rank>_<n>.distcp` files in which every item is a separate torch.save archive
at the offset `.metadata` records. Non-tensor items ("bytes" items: epoch counters, param_group
values, anything not a tensor) are loaded by DCP's default planner with
`torch.load(weights_only=False)` (torch 2.13, distributed/checkpoint/default_planner.py,
load_bytes), so each one is scanned like a checkpoint of its own.

`.metadata` is only read once its static scan is clean, and then through stand-in classes: the
allowlisted names (DCP dataclasses, torch.Size, dtypes) become plain records, so nothing from
torch.distributed is imported or run. Each item is scanned in place through a window on its file.

Known limitations: items written with storage transforms (DCP extensions such as compression)
are reported, not decompressed and scanned.
"""

from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from torch_skills.checkpoint.allowlist import (
    DCP_METADATA,
    NUMPY_DATA,
    TORCH_DTYPE_NAMES,
    TORCH_WEIGHTS_ONLY,
    Policy,
)
from torch_skills.checkpoint.confine import Confinement
from torch_skills.checkpoint.pickle_scan import PickleScan, scan_pickle
from torch_skills.checkpoint.problems import Problem
from torch_skills.checkpoint.zip_scan import scan_zip

_DCP = "torch.distributed.checkpoint"
MAX_BYTES_ITEM_SCAN = 1 << 30  # a non-tensor item this large is not a counter or a config


@dataclass
class DcpTensor:
    fqn: str
    dtype: str  # torch dtype name, e.g. "float32"
    shape: list[int]
    chunks: list[tuple[list[int], list[int]]]  # (offsets, sizes) of each saved chunk


@dataclass
class DcpItem:
    fqn: str
    chunk_offsets: list[int] | None  # None for a bytes item
    file: str
    offset: int
    length: int
    transformed: bool


@dataclass
class DcpMetadata:
    tensors: dict[str, DcpTensor] = field(default_factory=dict)
    bytes_items: list[str] = field(default_factory=list)
    items: list[DcpItem] = field(default_factory=list)
    paths: dict[str, tuple] = field(default_factory=dict)  # fqn -> original nested key path


@dataclass
class DcpFileScan:
    name: str
    bytes: int
    pickles: list[PickleScan] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


@dataclass
class DcpScan:
    files: list[DcpFileScan] = field(default_factory=list)
    metadata: DcpMetadata | None = None
    problems: list[Problem] = field(default_factory=list)


class _Record:
    """Stands in for an allowlisted class: keeps whatever the pickle gives it."""

    def __init__(self, *args: Any):
        self._args = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):
            self.__dict__.update(state)
        elif (
            isinstance(state, tuple)
            and len(state) == 2
            and all(s is None or isinstance(s, dict) for s in state)
        ):
            self.__dict__.update(state[0] or {})
            self.__dict__.update(state[1] or {})
        else:
            self._state = state


def _stand_in(qualified: str) -> Any:
    short = qualified.rsplit(".", 1)[-1]
    if qualified == "torch.Size":
        return lambda dims=(): tuple(dims)
    if qualified == "torch.serialization._get_layout":
        return lambda name: name
    if qualified in ("pathlib.PosixPath", "pathlib._local.PosixPath"):
        return lambda *parts: "/".join(str(p) for p in parts)
    if qualified == f"{_DCP}.metadata._MEM_FORMAT_ENCODING":
        return lambda value: value
    if qualified == "collections.OrderedDict":
        return dict
    if qualified == f"torch.{short}" and short in TORCH_DTYPE_NAMES:
        return short  # a dtype global becomes its name
    return type(short, (_Record,), {})


class _StandInUnpickler(pickle.Unpickler):
    """Resolves only allowlisted names, each to a stand-in; anything else is refused."""

    _allowed = TORCH_WEIGHTS_ONLY | DCP_METADATA | NUMPY_DATA

    def find_class(self, module: str, name: str) -> Any:
        qualified = f"{module}.{name}"
        if qualified not in self._allowed:
            raise pickle.UnpicklingError(f"{qualified} is not allowed in DCP metadata")
        return _stand_in(qualified)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids do not belong in DCP metadata")


def read_dcp_metadata(data: bytes) -> DcpMetadata:
    """Decode an already-scanned `.metadata` pickle into plain records (raises ValueError when odd)."""
    try:
        md = _StandInUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # the stand-ins cannot run anything; any failure means a malformed file
        raise ValueError(f"cannot decode the DCP metadata: {type(e).__name__}: {e}") from None
    try:
        return _records(md)
    except (TypeError, AttributeError, KeyError, IndexError, OverflowError) as e:
        # fields of the wrong type (an int where a list of offsets belongs, ...)
        raise ValueError(f"malformed DCP metadata: {type(e).__name__}: {str(e)[:200]}") from None


def _records(md: Any) -> DcpMetadata:
    out = DcpMetadata()
    sd_meta = getattr(md, "state_dict_metadata", None)
    storage = getattr(md, "storage_data", None)
    if not isinstance(sd_meta, dict) or not isinstance(storage, dict):
        raise ValueError("the DCP metadata has no state_dict_metadata/storage_data mappings")
    for fqn, meta in sd_meta.items():
        if not isinstance(fqn, str):
            raise ValueError(f"DCP metadata key {fqn!r} is not a string")
        if type(meta).__name__ == "TensorStorageMetadata":
            props = getattr(meta, "properties", None)
            state = getattr(props, "_state", None)
            dtype = getattr(props, "dtype", None) or (
                state[0] if isinstance(state, tuple) and state else None
            )
            chunks = [
                (list(getattr(c, "offsets", ())), list(getattr(c, "sizes", ())))
                for c in getattr(meta, "chunks", []) or []
            ]
            out.tensors[fqn] = DcpTensor(fqn, str(dtype), list(getattr(meta, "size", ())), chunks)
        else:
            out.bytes_items.append(fqn)
    for index, info in storage.items():
        fqn = getattr(index, "fqn", None)
        rel = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if (
            not isinstance(fqn, str)
            or not isinstance(rel, str)
            or type(offset) is not int
            or type(length) is not int
        ):
            raise ValueError("a DCP storage_data entry lacks fqn, relative_path, offset or length")
        chunk = getattr(index, "offset", None)
        out.items.append(
            DcpItem(
                fqn,
                list(chunk) if chunk is not None else None,
                rel,
                offset,
                length,
                bool(getattr(info, "transform_descriptors", None)),
            )
        )
    planner = getattr(md, "planner_data", None)
    if isinstance(planner, dict):
        out.paths = {k: tuple(v) for k, v in planner.items() if isinstance(k, str) and isinstance(v, tuple)}
    return out


class SliceFile(io.RawIOBase):
    """A read-only, seekable window [start, start + length) on an open file."""

    def __init__(self, f: BinaryIO, start: int, length: int):
        self._f, self._start, self._length, self._pos = f, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._length}[whence]
        self._pos = max(0, min(self._length, base + offset))
        return self._pos

    def read(self, n: int = -1) -> bytes:
        n = self._length - self._pos if n is None or n < 0 else min(n, self._length - self._pos)
        if n <= 0:
            return b""
        self._f.seek(self._start + self._pos)
        data = self._f.read(n)
        self._pos += len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")


def scan_dcp_dir(root: Path, policy: Policy, confine: Confinement | None = None) -> DcpScan:
    """Scan every metadata pickle, then every item of every .distcp file it points to.

    Every file is resolved first and must stay inside `confine` (default: `root` itself)."""
    scan = DcpScan()
    confine = confine or Confinement.of(root)
    meta_paths = sorted(p for p in root.iterdir() if p.name.endswith(".metadata") and p.is_file())
    dcp_policy = Policy(numpy=policy.numpy, dcp=True)
    main: tuple[DcpFileScan, bytes] | None = None
    for path in meta_paths:
        if confine.resolve(path) is None:
            scan.problems.append(confine.refusal(f"the metadata file {path.name!r}", str(path)))
            continue
        entry = DcpFileScan(path.name, path.stat().st_size)
        data = path.read_bytes()
        entry.pickles.append(scan_pickle(data, str(path), dcp_policy))
        scan.files.append(entry)
        if path.name == ".metadata":
            main = (entry, data)
    if main is None:
        scan.problems.append(Problem("dcp_no_metadata", str(root), "no .metadata file: not a DCP checkpoint"))
        return scan
    entry, data = main
    if not entry.pickles[0].safe:
        scan.problems.append(
            Problem(
                "dcp_metadata_unsafe",
                str(root / ".metadata"),
                ".metadata is unsafe; DCP reads it with plain pickle.load, so loading this checkpoint runs "
                "it. The items it points to were not read.",
            )
        )
        return scan
    try:
        scan.metadata = read_dcp_metadata(data)
    except ValueError as e:
        scan.problems.append(Problem("dcp_bad_metadata", str(root / ".metadata"), str(e)))
        return scan
    _scan_items(root, scan, policy, confine)
    return scan


def _scan_items(root: Path, scan: DcpScan, policy: Policy, confine: Confinement) -> None:
    assert scan.metadata is not None
    by_file: dict[str, list[DcpItem]] = {}
    for item in scan.metadata.items:
        if not _plain_name(item.file):
            scan.problems.append(
                Problem(
                    "dcp_item_outside_folder",
                    str(root / ".metadata"),
                    f"item {item.fqn!r} points at {item.file!r}; DCP would read a file outside the checkpoint",
                )
            )
            continue
        by_file.setdefault(item.file, []).append(item)
    tensor_fqns = set(scan.metadata.tensors)
    for name, items in sorted(by_file.items()):
        path = root / name
        if not path.is_file():
            scan.problems.append(
                Problem(
                    "dcp_missing_file",
                    str(path),
                    f"{len(items)} items live in {name}, which is missing; loading will fail",
                    blocks_safe=False,
                )
            )
            continue
        if confine.resolve(path) is None:
            scan.problems.append(confine.refusal(f"the data file {name!r} ({len(items)} items)", str(path)))
            continue
        size = path.stat().st_size
        file_scan = DcpFileScan(name, size)
        scan.files.append(file_scan)
        items.sort(key=lambda i: i.offset)
        end_prev, prev_name = 0, None
        with open(path, "rb") as f:
            for item in items:
                where = f"{path}@{item.offset}"
                if item.offset < 0 or item.length < 0 or item.offset + item.length > size:
                    file_scan.problems.append(
                        Problem(
                            "dcp_item_beyond_file",
                            where,
                            f"item {item.fqn!r} claims bytes {item.offset}..{item.offset + item.length} of a "
                            f"{size}-byte file",
                        )
                    )
                    continue
                if item.offset < end_prev:
                    file_scan.problems.append(
                        Problem("dcp_items_overlap", where, f"item {item.fqn!r} overlaps {prev_name!r}")
                    )
                end_prev, prev_name = max(end_prev, item.offset + item.length), item.fqn
                if item.transformed:
                    file_scan.problems.append(
                        Problem(
                            "dcp_item_transformed",
                            where,
                            f"item {item.fqn!r} is stored through a transform (compression); not scanned",
                        )
                    )
                    continue
                _scan_item(f, item, where, item.fqn in tensor_fqns, file_scan, policy)


def _scan_item(
    f: BinaryIO, item: DcpItem, where: str, is_tensor: bool, out: DcpFileScan, policy: Policy
) -> None:
    window = SliceFile(f, item.offset, item.length)
    head = window.read(4)
    window.seek(0)
    if head == b"PK\x03\x04":
        zscan = scan_zip(window, item.length, where, policy)
        out.pickles.extend(zscan.pickles)
        out.problems.extend(zscan.problems)
        if not is_tensor and any(p.unsafe_total for p in zscan.pickles):
            out.problems.append(
                Problem(
                    "dcp_bytes_item_unsafe",
                    where,
                    f"bytes item {item.fqn!r} is unsafe, and DCP's default load planner reads bytes items with "
                    "torch.load(weights_only=False): torch.distributed.checkpoint.load would run it",
                )
            )
        return
    if is_tensor:
        return  # raw tensor bytes (SerializationFormat.SAFETENSORS): nothing is unpickled
    if item.length > MAX_BYTES_ITEM_SCAN:
        out.problems.append(
            Problem("pickle_too_large", where, f"bytes item {item.fqn!r} is {item.length} bytes; not scanned")
        )
        return
    data = window.read()
    out.pickles.append(scan_pickle(data, where, policy))


def open_item(root: Path, item: DcpItem) -> tuple[BinaryIO, SliceFile]:
    """(the open file, a window on the item) for reading one item; close the file when done.

    Raises OSError for a name that is not a plain file name or resolves outside `root`."""
    path = Path(os.path.join(root, item.file))
    if not _plain_name(item.file) or Confinement.of(root).resolve(path) is None:
        raise OSError("a DCP item's file resolves outside the checkpoint folder; refused")
    f = open(path, "rb")  # noqa: SIM115 - the caller closes it
    return f, SliceFile(f, item.offset, item.length)

"""Open a checkpoint the static scan called safe, the safest way its format allows (worker only).

Use:

    loaded = load_checkpoint(scan, allow_numpy=True)   # scan: torch_skills.checkpoint.scan.StaticScan
    loaded.obj        # the contents; tensors are torch tensors, numpy arrays or TensorMeta
    loaded.how        # "torch.load(weights_only=True, mmap=True)", ...

- torch zip: `torch.load(weights_only=True, mmap=True, map_location="cpu")`, after checking that
  torch's own zip reader (PyTorchFileReader, miniz) lists the same records and returns the same
  data.pkl bytes the scan read through Python's zipfile; a disagreement means the scan may not
  have seen what torch unpickles, and loading stops. The numpy globals the scan allowed are
  passed to `torch.serialization.safe_globals`, named as the file names them.
- legacy torch stream: `torch.load(weights_only=True)` (it cannot be memory-mapped).
- plain pickle: `torch.load` refuses it (no magic number), so it is read by a pickle.Unpickler
  whose find_class returns only the allowlisted globals (the same objects weights_only uses).
- safetensors, DCP: nothing is unpickled for tensors: they become `TensorMeta` read on demand
  (safetensors by offset; DCP items through torch.load(weights_only=True) of each item);
  DCP bytes items are loaded with torch.load(weights_only=True), never DCP's weights_only=False.
- folders: each safe file as above, keyed by file name; trainer_state.json as JSON.

Raises `CheckpointLoadError` (with the loader's message) when the format's loader refuses the file.
"""

from __future__ import annotations

import functools
import importlib
import io
import json
import mmap
import pickle
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torch_skills.checkpoint.allowlist import JOBLIB_ARRAYS, NUMPY_DATA
from torch_skills.checkpoint.blob_scan import COMPRESSED, decompress, kind_of
from torch_skills.checkpoint.confine import Confinement
from torch_skills.checkpoint.dcp_format import DcpMetadata, DcpTensor, open_item
from torch_skills.checkpoint.pickle_scan import map_python2_name
from torch_skills.checkpoint.problems import Problem
from torch_skills.checkpoint.safetensors_format import DTYPE_BYTES, SafeTensorEntry, SafetensorsHeader
from torch_skills.checkpoint.scan import FileScan, StaticScan
from torch_skills.checkpoint.tree import TensorMeta
from torch_skills.checkpoint.zip_scan import read_raw_member

MAX_BYTES_ITEM = 64 << 20  # a DCP bytes item (counters, param_group values) larger than this is skipped
MAX_JSON_BYTES = 16 << 20
MAX_DECOMPRESSED = 1 << 30  # a compressed pickle (joblib) is inflated at most this far to load it


class CheckpointLoadError(Exception):
    """The format's own loader refused a file the scan called safe."""


def _loader_message(e: BaseException, limit: int) -> str:
    """The loader's reason, without torch's advice to retry with weights_only=False (never right for a
    file the tool could not verify): from a weights_only refusal only the unpickler's own error is kept."""
    text = str(e)
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text[text.index(marker) :]
    elif "weights_only" in text and "False" in text:
        text = re.sub(r"[^.\n]*weights_only[^.\n]*False[^.\n]*(\.|$)", "", text).strip()
    return text[:limit]


@dataclass
class LoadedCheckpoint:
    obj: Any
    how: str
    folder: bool = False  # obj maps file names to each file's contents
    mapped_file: Path | None = None  # tensors are slices of this private file mapping
    problems: list[Problem] = field(default_factory=list)
    model_files: list[str] = field(default_factory=list)  # in a folder: files holding model weights


def _numpy_globals(scan_globals: dict[str, str]) -> list[tuple[Any, str]]:
    """(object, name) pairs for torch.serialization.safe_globals: the numpy and data-class names the file uses.

    When it uses numpy names, the numpy.dtypes classes come too: the pickle never names them, but
    weights_only's BUILD checks the type of the dtype object it rebuilds (numpy >= 1.25). Only
    names from the static allowlist (tools/checkpoint/allowlist.py) get here, so nothing the file
    chose is imported; a library that is not installed is skipped (torch.load then names it).
    """
    names = [q for q, tier in sorted(scan_globals.items()) if tier in ("numpy", "data")]
    if any(tier == "numpy" for tier in scan_globals.values()):
        names += sorted(n for n in NUMPY_DATA if n.startswith("numpy.dtypes."))
    pairs = []
    for qualified in names:
        module, _, name = qualified.rpartition(".")
        candidates = [module]
        if module.startswith("numpy.core"):
            candidates.insert(0, module.replace("numpy.core", "numpy._core", 1))
        for candidate in candidates:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    obj = getattr(importlib.import_module(candidate), name)
                except (ImportError, AttributeError):
                    continue
            pairs.append((obj, qualified))
            break
    return pairs


def _allowed_objects(numpy_pairs: list[tuple[Any, str]]) -> dict[str, Any]:
    from torch._weights_only_unpickler import _get_allowed_globals

    allowed = dict(_get_allowed_globals())
    allowed.update({name: obj for obj, name in numpy_pairs})
    return allowed


class _AllowlistUnpickler(pickle.Unpickler):
    """pickle.Unpickler that can reach only allowlisted globals; persistent ids are refused."""

    def __init__(self, f: Any, allowed: dict[str, Any]):
        super().__init__(f)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        module, name = map_python2_name(module, name)
        qualified = f"{module}.{name}"
        if qualified not in self._allowed:
            raise pickle.UnpicklingError(f"{qualified} is not allowlisted")
        return self._allowed[qualified]

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError(
            "a plain pickle with persistent ids (torch storages) cannot be read alone"
        )


class _JoblibArray:
    """Stands in for joblib's NumpyArrayWrapper: BUILD fills its __dict__ (shape, order, dtype...)."""

    def read(self, f: Any, allowed: dict[str, Any]) -> Any:
        """The array joblib.load would build: the bytes after the wrapper, read as joblib reads them."""
        import numpy as np

        dtype, shape = self.__dict__.get("dtype"), tuple(self.__dict__.get("shape", ()))
        if not isinstance(dtype, np.dtype):
            raise pickle.UnpicklingError("a joblib array wrapper without a numpy dtype")
        if dtype.hasobject:  # joblib unpickles the array right there: with the same allowlist
            return _JoblibAwareUnpickler(f, allowed).load()
        if self.__dict__.get("numpy_array_alignment_bytes") is not None:
            padding = f.read(1)
            f.read(padding[0] if padding else 0)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        data = f.read(count * dtype.itemsize)
        array = np.frombuffer(data, dtype=dtype, count=count)
        if self.__dict__.get("order") == "F":
            return array.reshape(shape[::-1]).transpose()
        return array.reshape(shape)


class _JoblibAwareUnpickler(pickle._Unpickler):
    """The allowlist unpickler in pure Python, reading joblib's raw array bytes after each wrapper's
    BUILD the way joblib.load does (a file written by joblib.dump is not a plain pickle)."""

    dispatch = pickle._Unpickler.dispatch.copy()

    def __init__(self, f: Any, allowed: dict[str, Any]):
        super().__init__(f)
        self._raw, self._allowed = f, allowed

    def find_class(self, module: str, name: str) -> Any:
        module, name = map_python2_name(module, name)
        qualified = f"{module}.{name}"
        if qualified in JOBLIB_ARRAYS:
            return _JoblibArray
        if qualified not in self._allowed:
            raise pickle.UnpicklingError(f"{qualified} is not allowlisted")
        return self._allowed[qualified]

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError(
            "a plain pickle with persistent ids (torch storages) cannot be read alone"
        )

    def _load_build(self) -> None:
        pickle._Unpickler.load_build(self)
        if isinstance(self.stack[-1], _JoblibArray):
            self.stack[-1] = self.stack[-1].read(self._raw, self._allowed)

    dispatch[pickle.BUILD[0]] = _load_build


def _pickle_stream(file: FileScan) -> Any:
    """The file as a readable stream of pickle bytes: decompressed (bounded) when it is a zlib, gzip,
    bz2, xz or lzma stream (joblib's compressed files), else the file itself."""
    with open(file.path, "rb") as f:
        head = f.read(512)
    kind = kind_of(head)
    if kind in COMPRESSED.values() or kind == "zlib":
        return io.BytesIO(decompress(kind, file.path.read_bytes(), MAX_DECOMPRESSED))
    return open(file.path, "rb")  # noqa: SIM115 - the caller closes it


def cross_check_zip(file: FileScan) -> list[Problem]:
    """Compare torch's own zip reader with the scan's view of the archive."""
    zscan = file.zip
    if zscan is None or zscan.data_pkl is None:
        return []
    try:
        reader = torch._C.PyTorchFileReader(str(file.path))
        records = set(reader.get_all_records())
        data = reader.get_record("data.pkl")
    except Exception as e:  # the native reader rejects what zipfile accepted
        return [Problem("zip_parser_disagreement", file.name, f"torch's zip reader rejects the archive: {e}")]
    import hashlib

    prefix = f"{zscan.prefix}/" if zscan.prefix else ""
    ours = {m.name[len(prefix) :] for m in zscan.members if m.name.startswith(prefix)}
    problems = []
    if hashlib.sha256(bytes(data)).hexdigest() != zscan.data_pkl_sha256:
        problems.append(
            Problem(
                "zip_parser_disagreement",
                file.name,
                "torch's zip reader returns a different data.pkl than Python's zipfile: the file is built to "
                "show scanners one pickle and the loader another",
            )
        )
    if records != ours:
        extra = sorted(records ^ ours)[:3]
        problems.append(
            Problem(
                "zip_parser_disagreement",
                file.name,
                f"torch's zip reader and Python's zipfile list different records (e.g. {extra})",
            )
        )
    return problems


def _torch_load(path: Path, numpy_pairs: list[tuple[Any, str]], mmap: bool) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.serialization.safe_globals(numpy_pairs):
                return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # weights_only refusals, corrupt storages, out-of-bounds views
        hint = ""
        if "Unsupported global" in str(e):
            hint = (
                " If the global it names is in the scan's allowlist recipe, its library (omegaconf, transformers, "
                "lightning...) is not installed in the tool's Python; load it with the recipe where it is."
            )
        if isinstance(e, MemoryError) or "alloc" in str(e).lower():
            hint = (
                " The file may not fit the worker's memory limit: call again with a larger memory_limit_gib."
            )
        raise CheckpointLoadError(
            f"torch.load(weights_only=True) refused {path.name}: {_loader_message(e, 800)}{hint}"
        ) from None


class _SafetensorsReader:
    """Reads tensors of one safetensors file through a single shared mapping (opened on first use)."""

    def __init__(self, path: Path, header: SafetensorsHeader):
        self.path, self.header = path, header
        self._map: mmap.mmap | None = None

    def _data(self) -> mmap.mmap:
        if self._map is None:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return self._map

    def chunks(self, entry: SafeTensorEntry, dtype: torch.dtype, max_elems: int) -> Iterator[torch.Tensor]:
        itemsize = DTYPE_BYTES[entry.dtype]
        step = max(1, max_elems) * itemsize
        start = self.header.data_offset + entry.begin
        data = self._data()
        for at in range(start, start + entry.nbytes, step):
            piece = data[at : min(at + step, start + entry.nbytes)]  # a copy: bytes
            yield torch.frombuffer(bytearray(piece), dtype=dtype)  # (n,)

    def span(self, offset: int, nbytes: int) -> bytes:
        return self._data()[offset : offset + nbytes]

    def read(self, entry: SafeTensorEntry, dtype: torch.dtype) -> torch.Tensor:
        pieces = list(self.chunks(entry, dtype, 1 << 26))
        flat = torch.cat(pieces) if pieces else torch.empty(0, dtype=dtype)
        return flat.reshape(entry.shape)


def _safetensors_tree(path: Path, header: SafetensorsHeader) -> dict[str, TensorMeta]:
    reader = _SafetensorsReader(path, header)
    dtypes = {name: getattr(torch, name) for name in {e.torch_dtype for e in header.tensors}}
    out: dict[str, TensorMeta] = {}
    for entry in header.tensors:
        dtype = dtypes[entry.torch_dtype]
        out[entry.name] = TensorMeta(
            tuple(entry.shape),
            entry.torch_dtype,
            entry.nbytes,
            header.source,
            functools.partial(reader.read, entry, dtype),
            functools.partial(reader.chunks, entry, dtype),
            (reader, header.data_offset + entry.begin, entry.nbytes),
        )
    return out


def load_file(file: FileScan, numpy_pairs: list[tuple[Any, str]]) -> tuple[Any, str]:
    """(contents, how) for one safe file."""
    if file.format == "torch_zip":
        return _torch_load(file.path, numpy_pairs, mmap=True), "torch.load(weights_only=True, mmap=True)"
    if file.format == "torch_legacy":
        return _torch_load(
            file.path, numpy_pairs, mmap=False
        ), "torch.load(weights_only=True) (legacy format)"
    if file.format == "pickle":
        joblib = any(tier == "joblib" for p in file.pickles for tier in p.globals_used.values())
        reader = _JoblibAwareUnpickler if joblib else _AllowlistUnpickler
        try:
            with _pickle_stream(file) as f:
                obj = reader(f, _allowed_objects(numpy_pairs)).load()
        except Exception as e:
            raise CheckpointLoadError(
                f"the allowlist unpickler refused {file.name}: {_loader_message(e, 800)}"
            ) from None
        return obj, "pickle.Unpickler restricted to the weights_only allowlist"
    if file.format == "numpy":
        return _load_numpy(file), "numpy.load(allow_pickle=False)"
    if file.format == "archive" and file.zip is not None:
        return _load_nested_archives(
            file, numpy_pairs
        ), "torch.load(weights_only=True) of each nested torch archive"
    if file.format == "safetensors" and file.safetensors is not None:
        return _safetensors_tree(file.path, file.safetensors), "safetensors header (tensors read by offset)"
    if file.path.name.endswith(".json") and file.path.stat().st_size <= MAX_JSON_BYTES:
        try:
            return json.loads(file.path.read_text("utf-8")), "json"
        except (ValueError, UnicodeDecodeError) as e:
            raise CheckpointLoadError(f"{file.name} is not valid JSON: {e}") from None
    raise CheckpointLoadError(f"{file.name}: format {file.format} is not loaded")


def _load_numpy(file: FileScan) -> Any:
    import numpy as np

    try:
        if file.zip is not None:  # .npz: plain arrays only (the scan found no object array)
            with np.load(file.path, allow_pickle=False) as npz:
                return {key: npz[key] for key in npz.files}
        return np.load(file.path, allow_pickle=False, mmap_mode="r")
    except Exception as e:  # corrupt data the header did not reveal
        raise CheckpointLoadError(
            f"numpy.load(allow_pickle=False) refused {file.name}: {_loader_message(e, 400)}"
        ) from None


def _load_nested_archives(file: FileScan, numpy_pairs: list[tuple[Any, str]]) -> dict[str, Any]:
    """Members of a zip (torch.export's .pt2) that are torch archives, each through weights_only.

    Members are read the way torch's own zip reader reads them (zip_scan.read_raw_member: local
    header offsets, no CRC or local-name check), which is also how the scan read them."""
    assert file.zip is not None
    out: dict[str, Any] = {}
    with open(file.path, "rb") as f:
        for member in file.zip.members:
            if member.bytes > MAX_BYTES_ITEM or member.name.endswith("/"):
                continue
            try:
                if read_raw_member(f, member, 4) != b"PK\x03\x04":
                    continue
                data = read_raw_member(f, member, member.bytes)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with torch.serialization.safe_globals(numpy_pairs):
                        out[member.name] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            except Exception as e:
                raise CheckpointLoadError(
                    f"torch.load(weights_only=True) refused {file.name}::{member.name}: {_loader_message(e, 400)}"
                ) from None
    return out


# -- DCP -----------------------------------------------------------------------------------------
def _dcp_item_tensor(root: Path, item, dtype: torch.dtype, sizes: list[int]) -> torch.Tensor:
    f, window = open_item(root, item)
    with f:
        data = window.read()
    if data[:4] == b"PK\x03\x04":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(sizes)


def _dcp_tensor(root: Path, meta: DcpTensor, items: dict) -> TensorMeta:
    dtype = getattr(torch, meta.dtype, None) or torch.float32
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for d in meta.shape:
        numel *= d

    def chunks(max_elems: int) -> Iterator[torch.Tensor]:
        for offsets, sizes in meta.chunks:
            item = items.get((meta.fqn, tuple(offsets)))
            if item is None:
                continue
            flat = _dcp_item_tensor(root, item, dtype, sizes).reshape(-1)
            for start in range(0, flat.numel(), max_elems):
                yield flat[start : start + max_elems]

    def read() -> torch.Tensor:
        full = torch.empty(meta.shape, dtype=dtype)
        for offsets, sizes in meta.chunks:
            item = items.get((meta.fqn, tuple(offsets)))
            if item is None:
                raise CheckpointLoadError(f"DCP chunk {offsets} of {meta.fqn} has no storage entry")
            piece = _dcp_item_tensor(root, item, dtype, sizes)
            index = tuple(slice(o, o + s) for o, s in zip(offsets, sizes, strict=False))
            full[index] = piece.reshape(sizes)
        return full

    return TensorMeta(
        tuple(meta.shape), meta.dtype, numel * itemsize, f"{root.name}/{meta.fqn}", read, chunks
    )


def _set_path(tree: dict, path: tuple, value: Any) -> None:
    node = tree
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return
    node[path[-1]] = value


def _lists_from_int_keys(value: Any) -> Any:
    if isinstance(value, dict):
        converted = {k: _lists_from_int_keys(v) for k, v in value.items()}
        keys = list(converted)
        if keys and all(type(k) is int for k in keys) and sorted(keys) == list(range(len(keys))):
            return [converted[i] for i in range(len(keys))]
        return converted
    return value


def load_dcp(root: Path, md: DcpMetadata) -> dict:
    """The DCP state dict, nested back along planner_data, tensors as TensorMeta."""
    items = {(i.fqn, tuple(i.chunk_offsets) if i.chunk_offsets is not None else None): i for i in md.items}
    tree: dict = {}
    for fqn, meta in md.tensors.items():
        _set_path(tree, md.paths.get(fqn, tuple(fqn.split("."))), _dcp_tensor(root, meta, items))
    for fqn in md.bytes_items:
        item = items.get((fqn, None))
        value: Any = None
        if item is not None and item.length <= MAX_BYTES_ITEM and not item.transformed:
            f, window = open_item(root, item)
            with f:
                data = window.read()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    value = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            except Exception as e:
                raise CheckpointLoadError(
                    f"DCP bytes item {fqn}: torch.load(weights_only=True) refused it: {_loader_message(e, 800)}"
                ) from None
        _set_path(tree, md.paths.get(fqn, tuple(fqn.split("."))), value)
    return _lists_from_int_keys(tree)


# -- entry point ---------------------------------------------------------------------------------
def load_checkpoint(scan: StaticScan) -> LoadedCheckpoint:
    """Load a checkpoint whose static scan is safe; see the module docstring."""
    globals_used: dict[str, str] = {}
    for p in scan.pickles():
        globals_used.update(p.globals_used)
    numpy_pairs = _numpy_globals(globals_used)
    if scan.format == "dcp":
        assert scan.dcp is not None and scan.dcp.metadata is not None
        return LoadedCheckpoint(
            load_dcp(scan.path, scan.dcp.metadata), "DCP metadata + torch.load(weights_only=True) per item"
        )
    zips = [f for f in scan.files if f.format == "torch_zip"]
    problems = [p for f in zips for p in cross_check_zip(f)]
    if problems:
        return LoadedCheckpoint(None, "not loaded", problems=problems)
    if not scan.is_dir and scan.format != "safetensors_sharded":
        file = scan.files[0]
        obj, how = load_file(file, numpy_pairs)
        mapped = file.path if file.format == "torch_zip" else None
        return LoadedCheckpoint(obj, how, mapped_file=mapped)
    contents: dict[str, Any] = {}
    hows: set[str] = set()
    model_files: list[str] = []
    for file in scan.files:
        if file.format in ("safetensors_index",):
            continue
        obj, how = load_file(file, numpy_pairs)
        contents[file.name] = obj
        hows.add(how)
    if scan.format == "safetensors_sharded":
        merged: dict[str, Any] = {}
        for name, obj in contents.items():
            if isinstance(obj, Mapping):
                merged.update(obj)
            model_files.append(name)
        return LoadedCheckpoint(merged, "; ".join(sorted(hows)), model_files=model_files)
    json_name = "trainer_state.json"
    state_path = scan.path / json_name
    inside = Confinement.of(scan.path).resolve(state_path) is not None  # never a link out of the folder
    if inside and state_path.is_file() and state_path.stat().st_size <= MAX_JSON_BYTES:
        try:
            contents[json_name] = json.loads(state_path.read_text("utf-8"))
        except (ValueError, UnicodeDecodeError):
            pass
    return LoadedCheckpoint(contents, "; ".join(sorted(hows)), folder=True)

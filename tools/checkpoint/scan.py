"""Static safety scan of a checkpoint file or folder: nothing in it is loaded or run.

Use:

    scan = scan_path(Path("ckpt.pt"))            # or a folder: DCP, Hugging Face, sharded safetensors
    scan.format      # "torch_zip", "torch_legacy", "pickle", "safetensors", "dcp", "huggingface", ...
    scan.safe        # True only when every pickle parsed and nothing in it is unsafe
    scan.unsafe()    # UnsafeRef for every global outside the allowlist (with file and offset)
    scan.problems_all()

The format comes from the bytes, not the extension: a zip (torch.save since 1.6, or TorchScript),
a safetensors header, torch's legacy stream (five pickles, the first the magic number
0x1950a86a20f9469cfc6c, torch/serialization.py MAGIC_NUMBER, then raw storages) or a plain
pickle (scanned to the end, so a second pickle glued after the first is scanned too). A tar
archive (torch < 0.4) is refused. This module never imports torch; the worker loads only what it
calls safe.

Known limitations: folders are read one level deep (that is how DCP and Hugging Face lay them
out); files whose format is not recognised make the result unsafe ("cannot verify").
"""

from __future__ import annotations

import io
import mmap
import os
import pickletools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tools.checkpoint.allowlist import Policy
from tools.checkpoint.dcp_format import DcpScan, scan_dcp_dir
from tools.checkpoint.pickle_scan import PickleScan, ScanLimits, UnsafeRef, looks_like_pickle, scan_pickle
from tools.checkpoint.problems import Problem
from tools.checkpoint.safetensors_format import (
    SafetensorsHeader,
    SafetensorsIndex,
    read_safetensors_header,
    read_safetensors_index,
)
from tools.checkpoint.zip_scan import ZipScan, scan_zip_bytes, scan_zip_file

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch/serialization.py MAGIC_NUMBER
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle", ".safetensors", ".tar", ".pt2")
MAX_FOLDER_FILES = 10_000
HF_MARKERS = (
    "config.json",
    "trainer_state.json",
    "model.safetensors",
    "pytorch_model.bin",
    "adapter_model.safetensors",
)


@dataclass
class FileScan:
    """One scanned file: its detected format, its pickles and any structural problems."""

    path: Path
    name: str  # relative to the checkpoint root
    format: str
    bytes: int
    pickles: list[PickleScan] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    zip: ZipScan | None = None
    safetensors: SafetensorsHeader | None = None
    index: SafetensorsIndex | None = None


@dataclass
class StaticScan:
    path: Path
    is_dir: bool
    format: str
    files: list[FileScan] = field(default_factory=list)
    dcp: DcpScan | None = None
    problems: list[Problem] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def pickles(self) -> list[PickleScan]:
        return [p for f in self.files for p in f.pickles]

    def unsafe(self) -> list[UnsafeRef]:
        return [u for p in self.pickles() for u in p.unsafe]

    def unsafe_total(self) -> int:
        return sum(p.unsafe_total for p in self.pickles())

    def problems_all(self) -> list[Problem]:
        found = list(self.problems)
        for f in self.files:
            found.extend(f.problems)
        for p in self.pickles():
            if not p.complete:
                found.append(
                    Problem(
                        "pickle_scan_limit" if p.limit_hit else "unparseable_pickle",
                        f"{p.source}@{p.error_offset}",
                        f"{p.error}. A pickle that cannot be fully parsed cannot be called safe: the "
                        "unpickler runs every opcode before the break.",
                    )
                )
            if p.frame_crossings:
                only = ", ".join(p.file_reader_globals[:3]) or "nothing more"
                found.append(
                    Problem(
                        "pickle_frame_ambiguous",
                        f"{p.source}@{p.frame_crossing_offset}",
                        f"{p.frame_crossing_what} runs past the end of its FRAME ({p.frame_crossings}x). No pickler "
                        "writes that; pickle.loads reads such a stream one way and the C unpickler reading a file "
                        f"(pickle.load, torch.load) another, which names {only}. Treat it as hostile.",
                    )
                )
            if p.complete and p.trailing_error:
                found.append(
                    Problem(
                        "pickle_trailing_bytes",
                        p.source,
                        f"{p.trailing_bytes} trailing bytes: {p.trailing_error}",
                        severity="warning",
                        blocks_safe=False,
                    )
                )
        return found

    @property
    def safe(self) -> bool:
        if self.unsafe_total():
            return False
        return not any(p.blocks_safe for p in self.problems_all())


def sniff(path: Path) -> str:
    """'zip', 'safetensors', 'tar', 'pickle', 'json' or 'unknown', from the first bytes."""
    with open(path, "rb") as f:
        head = f.read(512)
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if len(head) >= 9 and head[8:9] == b"{":
        return "safetensors"
    if head[257:262] == b"ustar":
        return "tar"
    if looks_like_pickle(head):
        return "pickle"
    if head.lstrip()[:1] in (b"{", b"[") and path.suffix == ".json":
        return "json"
    if head[:1] in b"(c]}ILSVNFG)l" and head:
        return "pickle"  # protocol 0/1 pickles start with a plain opcode
    return "unknown"


def _is_legacy_torch(data) -> bool:
    """True when the stream starts with torch's legacy magic-number pickle."""
    try:
        for op, arg, _ in pickletools.genops(io.BytesIO(bytes(data[:64]))):
            if op.name in ("PROTO", "FRAME"):
                continue
            return op.name in ("LONG1", "LONG", "INT") and arg == LEGACY_MAGIC
    except (ValueError, EOFError):
        return False
    return False


def _nested_scanner(policy: Policy, limits: ScanLimits, level: int = 1) -> Callable:
    """Scan bytes handed to pickle.loads / torch's _load_from_bytes: a pickle or a torch zip."""

    def nested(data: bytes, source: str, offset: int) -> list[UnsafeRef]:
        if level > limits.max_nested:
            return []
        inner = _nested_scanner(policy, limits, level + 1)
        if data[:4] == b"PK\x03\x04":
            zscan = scan_zip_bytes(data, source, policy, scan_limits=limits, nested=inner)
            return [u for p in zscan.pickles for u in p.unsafe]
        if looks_like_pickle(data[:2]):
            return scan_pickle(data, source, policy, limits, nested=inner).unsafe
        return []

    return nested


def scan_file(path: Path, name: str, policy: Policy, limits: ScanLimits) -> FileScan:
    """Scan one file according to what its bytes say it is."""
    size = path.stat().st_size
    if size == 0:
        return FileScan(path, name, "unknown", 0, problems=[Problem("empty_file", name, "the file is empty")])
    kind = sniff(path)
    nested = _nested_scanner(policy, limits)
    if kind == "zip":
        zscan = scan_zip_file(path, policy, scan_limits=limits, source=name)
        fmt = "torchscript" if zscan.is_torchscript else ("torch_zip" if zscan.data_pkl else "unknown")
        result = FileScan(path, name, fmt, size, zscan.pickles, list(zscan.problems), zip=zscan)
        if zscan.is_torchscript:
            result.problems.append(
                Problem(
                    "torchscript_archive",
                    name,
                    "a TorchScript archive: torch.jit.load compiles and runs its code/, and "
                    "torch.load(weights_only=True) refuses it; load it only from a trusted source",
                )
            )
        return result
    if kind == "safetensors":
        header = read_safetensors_header(path, source=name)
        return FileScan(path, name, "safetensors", size, problems=list(header.problems), safetensors=header)
    if kind == "json" and path.name.endswith(".index.json"):
        index = read_safetensors_index(path)
        return FileScan(path, name, "safetensors_index", size, problems=list(index.problems), index=index)
    if kind == "tar":
        return FileScan(
            path,
            name,
            "legacy_tar",
            size,
            problems=[
                Problem(
                    "legacy_tar_format",
                    name,
                    "a tar-format checkpoint from torch < 0.4; its pickles are not scanned. Load it once "
                    "in a sandbox and re-save it with torch.save",
                )
            ],
        )
    if kind == "pickle":
        try:
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                if _is_legacy_torch(data):
                    scan = scan_pickle(
                        data, name, policy, limits, expected=5, scan_trailing=False, nested=nested
                    )
                    return FileScan(path, name, "torch_legacy", size, [scan])
                scan = scan_pickle(data, name, policy, limits, nested=nested)
        except (OSError, ValueError, MemoryError) as e:  # mapping refused: address-space limit
            problem = Problem(
                "file_not_mappable",
                name,
                f"the {size}-byte file could not be memory-mapped for scanning ({e}); raise memory_limit_gib",
            )
            return FileScan(path, name, "pickle", size, problems=[problem])
        if scan.pickles == 0 and scan.opcodes <= 1:
            return FileScan(
                path,
                name,
                "unknown",
                size,
                problems=[
                    Problem("unknown_format", name, f"not a pickle, zip or safetensors file ({scan.error})")
                ],
            )
        return FileScan(path, name, "pickle", size, [scan])
    return FileScan(
        path,
        name,
        "unknown",
        size,
        problems=[
            Problem(
                "unknown_format",
                name,
                "not a torch.save zip, legacy torch file, pickle, safetensors or DCP file; cannot verify it",
            )
        ],
    )


def _check_index(root: Path, index_scan: FileScan, by_name: dict[str, FileScan]) -> None:
    """Every shard the index names exists and holds the tensors the index puts there."""
    index = index_scan.index
    if index is None:
        return
    wanted: dict[str, set[str]] = {}
    for tensor, shard in index.weight_map.items():
        wanted.setdefault(shard, set()).add(tensor)
    for shard, names in wanted.items():
        shard_scan = by_name.get(shard)
        if shard_scan is None:
            index_scan.problems.append(
                Problem(
                    "index_missing_shard",
                    index_scan.name,
                    f"the index puts {len(names)} tensors in {shard}, which is missing; loading will fail",
                    blocks_safe=False,
                )
            )
            continue
        header = shard_scan.safetensors
        if header is None:
            continue
        present = {t.name for t in header.tensors}
        missing = sorted(names - present)
        if missing:
            index_scan.problems.append(
                Problem(
                    "index_tensor_not_in_shard",
                    index_scan.name,
                    f"{len(missing)} tensors the index places in {shard} are not there (e.g. {missing[0]})",
                    blocks_safe=False,
                )
            )
        extra = sorted(present - names)
        if extra:
            index_scan.problems.append(
                Problem(
                    "shard_tensor_not_in_index",
                    shard_scan.name,
                    f"{len(extra)} tensors in this shard are not in the index (e.g. {extra[0]}); loaders skip them",
                    severity="warning",
                    blocks_safe=False,
                )
            )


def _folder_files(root: Path, problems: list[Problem]) -> list[Path]:
    """Regular files one level down; links that leave the folder are reported and skipped."""
    files = []
    inside = root.resolve()
    for entry in sorted(root.iterdir()):
        if entry.is_symlink() and not entry.resolve().is_relative_to(inside):
            problems.append(
                Problem(
                    "link_outside_folder",
                    str(entry),
                    f"a symbolic link to {entry.resolve()}, outside the checkpoint folder; not followed",
                )
            )
            continue
        if entry.is_file():
            files.append(entry)
            if len(files) > MAX_FOLDER_FILES:
                break
    return files


def scan_path(
    path: str | os.PathLike,
    policy: Policy | None = None,
    limits: ScanLimits | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> StaticScan:
    """Scan a checkpoint file or folder; see the module docstring."""
    started = time.perf_counter()
    policy = policy or Policy()
    limits = limits or ScanLimits()
    root = Path(path)
    if root.is_dir():
        result = _scan_folder(root, policy, limits, progress)
    else:
        single = scan_file(root, root.name, policy, limits)
        fmt = single.format
        result = StaticScan(root, False, fmt, [single])
        if single.format == "safetensors_index":
            result.format = "safetensors_sharded"
            by_name = {}
            for shard in single.index.shards if single.index else []:
                shard_path = root.parent / shard
                if shard_path.is_file():
                    shard_scan = scan_file(shard_path, shard, policy, limits)
                    result.files.append(shard_scan)
                    by_name[shard] = shard_scan
            _check_index(root.parent, single, by_name)
    result.seconds = time.perf_counter() - started
    return result


def _scan_folder(root: Path, policy: Policy, limits: ScanLimits, progress) -> StaticScan:
    link_problems: list[Problem] = []
    files = _folder_files(root, link_problems)
    names = {p.name for p in files}
    if any(n.endswith(".metadata") for n in names) and any(n.endswith(".distcp") for n in names):
        dcp = scan_dcp_dir(root, policy)
        result = StaticScan(root, True, "dcp", dcp=dcp, problems=link_problems + list(dcp.problems))
        for entry in dcp.files:
            fmt = "dcp_metadata" if entry.name.endswith(".metadata") else "dcp_data"
            result.files.append(
                FileScan(root / entry.name, entry.name, fmt, entry.bytes, entry.pickles, entry.problems)
            )
        return result
    candidates = [p for p in files if p.suffix in CHECKPOINT_SUFFIXES or p.name.endswith(".index.json")]
    skipped = [p.name for p in files if p not in candidates and p.suffix not in (".json", ".txt", ".md")]
    fmt = (
        "huggingface"
        if any(n in names for n in HF_MARKERS) or any(n.endswith(".index.json") for n in names)
        else "directory"
    )
    result = StaticScan(root, True, fmt, problems=link_problems)
    if len(files) > MAX_FOLDER_FILES:
        result.problems.append(
            Problem(
                "folder_too_large",
                str(root),
                f"more than {MAX_FOLDER_FILES} files; only the first were scanned",
            )
        )
    if not candidates:
        result.problems.append(
            Problem(
                "no_checkpoint_files",
                str(root),
                f"no checkpoint files ({', '.join(CHECKPOINT_SUFFIXES)}) in this folder; nothing was verified",
            )
        )
        return result
    if skipped:
        result.problems.append(
            Problem(
                "unscanned_files",
                str(root),
                f"{len(skipped)} files with other extensions were not scanned (e.g. {', '.join(skipped[:3])}); "
                "this tool never loads them, but check them before another tool does",
                severity="info",
                blocks_safe=False,
            )
        )
    for i, path in enumerate(candidates):
        if progress is not None:
            progress(i, len(candidates), f"scanning {path.name}")
        result.files.append(scan_file(path, path.name, policy, limits))
    by_name = {f.name: f for f in result.files}
    for f in result.files:
        if f.format == "safetensors_index":
            _check_index(root, f, by_name)
    return result

"""Static safety scan of a checkpoint file or folder: nothing in it is loaded or run.

Use:

    scan = scan_path(Path("ckpt.pt"))            # or a folder: DCP, Hugging Face, sharded safetensors
    scan.format      # "torch_zip", "torch_legacy", "pickle", "safetensors", "dcp", "huggingface", ...
    scan.safe        # True only when every pickle parsed and nothing in it is unsafe
    scan.unsafe()    # UnsafeRef for every global outside the allowlist (with file and offset)
    scan.problems_all()

The format comes from the bytes, not the extension: a zip (torch.save since 1.6, TorchScript,
numpy's .npz, torch.export's .pt2; every member is scanned by its content, see blob_scan.py), a
safetensors header, a .npy (an object array's data is a pickle), torch's legacy stream (five
pickles, the first the magic number 0x1950a86a20f9469cfc6c, torch/serialization.py MAGIC_NUMBER,
then raw storages), a tar archive, a zlib/gzip/bz2/xz stream (joblib's compressed files), or a
plain pickle (scanned to the end, so a second pickle glued after the first is scanned too).
Formats the standard library cannot open (7z, RAR, zstd, lz4) are reported as unscanned and
never called safe. Folders are walked recursively (bounded) and every file is sniffed, whatever
its name, so a `.joblib` or `training_args.bin` beside the weights is scanned too; a subfolder
holding `.metadata` and `.distcp` files is read as a DCP checkpoint. Any reader error becomes a
"corrupt/unreadable" problem, never an exception. This module never imports torch; the worker
loads only what it calls safe.

Known limitations: files whose format is not recognised make a single-file result unsafe
("cannot verify"); inside a folder they are data unless their name says a loader unpickles them.
"""

from __future__ import annotations

import io
import mmap
import os
import pickletools
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torch_skills.checkpoint.allowlist import Policy
from torch_skills.checkpoint.blob_scan import (
    COMPRESSED,
    ScanContext,
    kind_of,
    scan_compressed,
    unscanned_problem,
)
from torch_skills.checkpoint.confine import Confinement
from torch_skills.checkpoint.dcp_format import DcpScan, scan_dcp_dir
from torch_skills.checkpoint.npy_format import header_problem, read_npy_header
from torch_skills.checkpoint.pickle_scan import PickleScan, ScanLimits, UnsafeRef, scan_pickle
from torch_skills.checkpoint.problems import Problem
from torch_skills.checkpoint.safetensors_format import (
    SafetensorsHeader,
    SafetensorsIndex,
    read_safetensors_header,
    read_safetensors_index,
)
from torch_skills.checkpoint.tar_scan import scan_tar
from torch_skills.checkpoint.zip_scan import ZipScan, scan_zip_file

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch/serialization.py MAGIC_NUMBER
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle", ".safetensors", ".tar", ".pt2")
# Files a loader unpickles because of their name (torch.load, pickle, joblib, dill, np.load):
# in a folder, these must parse as what they claim; other files are sniffed and may be data.
PICKLE_SUFFIXES = frozenset(
    ".pt .pth .bin .ckpt .pkl .pickle .pckl .p .joblib .jbl .dill .sav .npy .npz .pt2 .tar .gz .bz2 .xz .zip".split()
)
MAX_FOLDER_FILES = 10_000
MAX_FOLDER_DEPTH = 8
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
    """'zip', 'safetensors', 'tar', 'npy', 'pickle', 'json', a compression or 'unknown', from the first bytes."""
    with open(path, "rb") as f:
        head = f.read(512)
    kind = kind_of(head)
    if (
        kind == "pickle"
        and not (head[:1] == b"\x80" and len(head) > 1 and head[1] <= 5)
        and head[:1] not in b"(c]}ILSVNFG)l"
    ):
        kind = "pickle_maybe"  # some other opcode first: a pickle only if it parses as one
    if kind in ("data", "pickle_maybe") and head.lstrip()[:1] in (b"{", b"[") and path.suffix == ".json":
        return "json"
    if kind == "data":
        return "unknown"
    return "pickle" if kind == "pickle_maybe" else kind


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
    """Scan bytes handed to pickle.loads / torch's _load_from_bytes: a pickle, a torch zip, anything."""

    def nested(data: bytes, source: str, offset: int) -> list[UnsafeRef]:
        if level > limits.max_nested:
            return []
        from torch_skills.checkpoint.blob_scan import scan_blob

        ctx = ScanContext(policy, limits, nested=_nested_scanner(policy, limits, level + 1))
        return [u for p in scan_blob(data, source, ctx, strict=True).pickles for u in p.unsafe]

    return nested


def _context(policy: Policy, limits: ScanLimits) -> ScanContext:
    return ScanContext(policy, limits, nested=_nested_scanner(policy, limits))


def scan_file(
    path: Path,
    name: str,
    policy: Policy,
    limits: ScanLimits,
    strict: bool = True,
    ctx: ScanContext | None = None,
) -> FileScan:
    """Scan one file according to what its bytes say it is; never raises for a corrupt file."""
    try:
        return _scan_file(path, name, policy, limits, strict, ctx or _context(policy, limits))
    except (Exception, RecursionError) as e:  # noqa: BLE001 - a reader bug must not hide the file
        where = traceback.extract_tb(e.__traceback__)[-1]
        return FileScan(
            path,
            name,
            "unknown",
            _size(path),
            problems=[
                Problem(
                    "unreadable_file",
                    name,
                    f"corrupt/unreadable: {type(e).__name__}: {str(e)[:200]} (in {Path(where.filename).name}:"
                    f"{where.lineno}); it cannot be verified",
                )
            ],
        )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _scan_file(
    path: Path, name: str, policy: Policy, limits: ScanLimits, strict: bool, ctx: ScanContext
) -> FileScan:
    size = path.stat().st_size
    if size == 0:
        return FileScan(path, name, "unknown", 0, problems=[Problem("empty_file", name, "the file is empty")])
    kind = sniff(path)
    nested = ctx.nested
    if kind == "zip":
        zscan = scan_zip_file(path, policy, scan_limits=limits, source=name, ctx=ctx)
        names = [m.name for m in zscan.members]
        if zscan.is_torchscript:
            fmt = "torchscript"
        elif zscan.data_pkl:
            fmt = "torch_zip"
        elif names and all(n.endswith(".npy") for n in names):
            fmt = "numpy"
        else:
            fmt = "archive"
        result = FileScan(path, name, fmt, size, zscan.pickles, list(zscan.problems), zip=zscan)
        if zscan.is_torchscript:
            shown = ", ".join(zscan.code_files[:8]) + (" ..." if len(zscan.code_files) > 8 else "")
            result.problems.append(
                Problem(
                    "torchscript_archive",
                    name,
                    f"a TorchScript archive: torch.jit.load compiles and runs its code ({len(zscan.code_files)} "
                    f"files: {shown or 'none listed'}), and torch.load(weights_only=True) refuses it; load it only "
                    "from a trusted source, or re-export its weights with torch.jit.load(...).state_dict() there",
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
        with open(path, "rb") as f:
            t = scan_tar(f, name, ctx)
            head = f.seek(0) or f.read(512)
        pickles = list(t.pickles)
        if head[257:262] != b"ustar" and size <= ctx.max_blob_bytes:
            # an old v7 header: torch.load opens it as a tar, pickle.load reads its name field as a pickle
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                as_pickle = scan_pickle(data, f"{name} (read as a pickle)", policy, limits, nested=nested)
            if as_pickle.unsafe_total:
                pickles.append(as_pickle)
        return FileScan(path, name, "legacy_tar" if t.torch_legacy else "archive", size, pickles, t.problems)
    if kind.startswith("unscanned:"):
        return FileScan(path, name, "archive", size, problems=[unscanned_problem(kind, name)])
    if kind == "npy":
        return _scan_npy_file(path, name, size, ctx)
    if kind in COMPRESSED.values() or kind == "zlib":
        if size > ctx.max_blob_bytes:
            problem = Problem(
                "file_too_large", name, f"a {size}-byte {kind} stream; too large to decompress and scan"
            )
            return FileScan(path, name, "archive", size, problems=[problem])
        found = scan_compressed(kind, path.read_bytes(), name, ctx, 0, strict)
        if not found.pickles and not found.problems and kind == "zlib":
            kind = "pickle"  # two bytes that only looked like a zlib header
        else:
            return FileScan(
                path, name, "pickle" if found.pickles else "archive", size, found.pickles, found.problems
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
        not_pickle = scan.pickles == 0 and scan.opcodes <= 1
        lenient_data = not strict and not (
            scan.unsafe_total or scan.complete or scan.limit_hit or scan.frame_crossings
        )
        if not_pickle or lenient_data:
            if not strict:
                return FileScan(path, name, "data", size)
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
    if not strict:
        return FileScan(path, name, "data", size)
    return FileScan(
        path,
        name,
        "unknown",
        size,
        problems=[
            Problem(
                "unknown_format",
                name,
                "not a torch.save zip, legacy torch file, pickle, safetensors, numpy, archive or DCP file; "
                "cannot verify it",
            )
        ],
    )


def _scan_npy_file(path: Path, name: str, size: int, ctx: ScanContext) -> FileScan:
    with open(path, "rb") as f:
        head = f.read((1 << 20) + 16)
    header = read_npy_header(head)
    if not header.ok:
        return FileScan(path, name, "numpy", size, problems=[header_problem(header, name)])
    if not header.has_object:
        problems = []
        if header.nbytes is not None and size - header.data_offset < header.nbytes:
            problems.append(
                Problem(
                    "npy_truncated",
                    name,
                    f"corrupt/unreadable .npy: shape {header.shape} needs {header.nbytes} bytes, "
                    f"{size - header.data_offset} follow the header",
                )
            )
        return FileScan(path, name, "numpy", size, problems=problems)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        scan = scan_pickle(
            data,
            f"{name} (object array)",
            ctx.policy,
            ctx.limits,
            nested=ctx.nested,
            start=header.data_offset,
        )
    return FileScan(path, name, "numpy", size, [scan])


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
        present = set(header.tensor_names)
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
    """Regular files under root, recursively (bounded); links that leave the folder are reported and skipped."""
    files: list[Path] = []
    inside = root.resolve()
    pending = [(root, 0)]
    while pending:
        folder, depth = pending.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            problems.append(Problem("unreadable_folder", str(folder), f"corrupt/unreadable folder: {e}"))
            continue
        for entry in entries:
            path = Path(entry.path)
            if entry.is_symlink():
                target = path.resolve()
                if not target.is_relative_to(inside):
                    problems.append(
                        Problem(
                            "link_outside_folder",
                            str(path),
                            "a symbolic link that leads outside the checkpoint folder; not followed or read",
                        )
                    )
                    continue
                if target.is_dir():
                    continue  # a link to a folder inside: its files are reached directly
            if entry.is_dir(follow_symlinks=False):
                if depth + 1 < MAX_FOLDER_DEPTH:
                    pending.append((path, depth + 1))
                else:
                    problems.append(
                        Problem(
                            "folder_too_deep",
                            str(path),
                            f"deeper than {MAX_FOLDER_DEPTH} levels; not scanned",
                        )
                    )
            elif entry.is_file():
                files.append(path)
                if len(files) > MAX_FOLDER_FILES:
                    return files
    return sorted(files)


def scan_path(
    path: str | os.PathLike,
    policy: Policy | None = None,
    limits: ScanLimits | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    allowed_roots: Sequence[str | os.PathLike] = (),
) -> StaticScan:
    """Scan a checkpoint file or folder; see the module docstring.

    Every other file it opens (index shards, DCP data files, folder members) must resolve inside the
    checked folder (a file's parent) and, when given, inside one of `allowed_roots` (confine.py)."""
    started = time.perf_counter()
    policy = policy or Policy()
    limits = limits or ScanLimits()
    root = Path(path)
    if root.is_dir():
        result = _scan_folder(root, policy, limits, progress, Confinement.of(root, allowed_roots))
    else:
        single = scan_file(root, root.name, policy, limits)
        fmt = single.format
        result = StaticScan(root, False, fmt, [single])
        if single.format == "safetensors_index":
            result.format = "safetensors_sharded"
            by_name = {}
            confine = Confinement.of(root.parent, allowed_roots)
            for shard in single.index.shards if single.index else []:
                shard_path = root.parent / shard
                if confine.resolve(shard_path) is None:
                    result.problems.append(confine.refusal(f"the shard {shard!r}", root.name))
                    by_name[shard] = FileScan(shard_path, shard, "refused", 0)
                    continue
                if shard_path.is_file():
                    shard_scan = scan_file(shard_path, shard, policy, limits)
                    result.files.append(shard_scan)
                    by_name[shard] = shard_scan
            _check_index(root.parent, single, by_name)
    result.seconds = time.perf_counter() - started
    return result


def _confined(path: Path, root: Path, confine: Confinement, problems: list[Problem]) -> bool:
    """True when `path` resolves inside the folder and roots; else a refusal is recorded."""
    if confine.resolve(path) is not None:
        return True
    problems.append(confine.refusal(f"the file {str(path.relative_to(root))!r}", str(root)))
    return False


def _is_dcp(names: set[str]) -> bool:
    return ".metadata" in names and any(n.endswith(".distcp") for n in names)


def _scan_folder(
    root: Path, policy: Policy, limits: ScanLimits, progress, confine: Confinement
) -> StaticScan:
    problems: list[Problem] = []
    files = [p for p in _folder_files(root, problems) if _confined(p, root, confine, problems)]
    by_folder: dict[Path, set[str]] = {}
    for p in files:
        by_folder.setdefault(p.parent, set()).add(p.name)
    dcp_folders = {folder for folder, names in by_folder.items() if _is_dcp(names)}
    top = by_folder.get(root, set())
    if root in dcp_folders:
        fmt = "dcp"
    elif any(n in top for n in HF_MARKERS) or any(n.endswith(".index.json") for n in top):
        fmt = "huggingface"
    else:
        fmt = "directory"
    result = StaticScan(root, True, fmt, problems=problems)
    if len(files) > MAX_FOLDER_FILES:
        result.problems.append(
            Problem(
                "folder_too_large",
                str(root),
                f"more than {MAX_FOLDER_FILES} files; the rest were not scanned, so the folder cannot be called safe",
            )
        )
    for folder in sorted(dcp_folders):
        try:
            dcp = scan_dcp_dir(folder, policy, Confinement(confine.folder, confine.roots))
        except (OSError, ValueError, RecursionError, MemoryError) as e:
            result.problems.append(
                Problem(
                    "unreadable_dcp",
                    str(folder),
                    f"corrupt/unreadable DCP checkpoint: {type(e).__name__}: {e}",
                )
            )
            continue
        prefix = "" if folder == root else f"{folder.relative_to(root)}/"
        if folder == root:
            result.dcp = dcp
        result.problems.extend(dcp.problems)
        for entry in dcp.files:
            fmt_ = "dcp_metadata" if entry.name.endswith(".metadata") else "dcp_data"
            result.files.append(
                FileScan(
                    folder / entry.name, prefix + entry.name, fmt_, entry.bytes, entry.pickles, entry.problems
                )
            )
    ctx = _context(policy, limits)
    others = [p for p in files if p.parent not in dcp_folders]
    data_files: list[str] = []
    for i, path in enumerate(others):
        name = str(path.relative_to(root))
        if progress is not None:
            progress(i, len(others), f"scanning {name}")
        if path.suffix == ".json" and not path.name.endswith(".index.json"):
            continue
        if path.suffix == ".py":
            result.problems.append(
                Problem(
                    "python_code_in_folder",
                    name,
                    "Python code beside the weights: transformers runs it only with trust_remote_code=True; "
                    "read it before enabling that",
                    severity="warning",
                    blocks_safe=False,
                )
            )
            continue
        scanned = scan_file(path, name, policy, limits, strict=path.suffix in PICKLE_SUFFIXES, ctx=ctx)
        if scanned.format == "data":
            data_files.append(name)
            continue
        result.files.append(scanned)
    if data_files:
        result.problems.append(
            Problem(
                "data_files",
                str(root),
                f"{len(data_files)} files hold no pickle, archive or tensor format (e.g. {', '.join(data_files[:3])}); "
                "every file was sniffed, and these are plain data to any loader",
                severity="info",
                blocks_safe=False,
            )
        )
    if not result.files:
        result.problems.append(
            Problem(
                "no_checkpoint_files",
                str(root),
                "no checkpoint files (pickles, torch archives, safetensors, numpy, DCP) in this folder; "
                "nothing was verified",
            )
        )
        return result
    by_name = {f.name: f for f in result.files}
    for f in result.files:
        if f.format == "safetensors_index":
            _check_index(root, f, by_name)
    return result

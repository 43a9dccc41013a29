"""Inspect a zip archive (torch.save, .npz, torch.export .pt2, anything zipped) as hostile input.

Use:

    scan = scan_zip_file("model.pt")                      # or scan_zip(fileobj, size, source)
    scan.pickles      # PickleScan of data.pkl and of every pickle found in any member
    scan.problems     # Problem(...) for a truncated file, '..' or absolute names, duplicate names,
                      # sizes beyond the file, overlapping members, zip bombs, lying sizes, encryption...
    scan.data_pkl     # the member torch.load would unpickle ("archive/data.pkl"), if any

The end-of-central-directory record is read first, so a claimed million entries or a central
directory beyond the file is refused before `zipfile` builds anything. Bombs are refused from the
headers, before any byte is inflated: a declared ratio over `ZipLimits.max_ratio`, compressed
data larger than deflate could produce for the declared size (a lying header), or declared sizes
past `max_total_bytes`. Members torch reads as raw storage bytes (those data.pkl's persistent
ids name) are never parsed as pickles; every other member, whatever its name, is read in pieces
(never past its declared size) and handed to `blob_scan.scan_blob`, which finds pickles of any
protocol (with or without PROTO), .npy object arrays, nested archives and compressed streams.
Members are read the way torch's own zip reader (miniz in PyTorchFileReader) reads them, not
the way Python's zipfile does: names are found without regard to letter case (`DATA.PKL` is
torch's data.pkl), the data starts where the local header's lengths say, the local header's name
is not compared with the central directory's (a mismatch is reported as hostile) and no CRC is
checked (a bad one is reported as a warning); so what is scanned is what torch.load unpickles.
Python's zipfile only lists the central directory. Every member that cannot be read (bad deflate
data, version needed 255, empty names, negative seeks) becomes a "corrupt/unreadable" problem,
never a silent skip.

Known limitations: a TorchScript archive's code/ is reported, not analysed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import BinaryIO

from torch_skills.checkpoint.allowlist import Policy
from torch_skills.checkpoint.blob_scan import ScanContext, kind_of, scan_blob
from torch_skills.checkpoint.pickle_scan import PickleScan, ScanLimits, scan_pickle
from torch_skills.checkpoint.problems import Problem

_EOCD = b"PK\x05\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"
_EOCD64 = b"PK\x06\x06"
_LOCAL = b"PK\x03\x04"
_EOCD_MAX_TAIL = 22 + 0xFFFF  # fixed record + the longest comment


@dataclass(frozen=True)
class ZipLimits:
    max_entries: int = 1_000_000  # a 100k-tensor checkpoint has ~100k members
    max_pickle_bytes: int = 1 << 30  # data.pkl of the largest public models is a few MiB
    max_ratio: int = 1_000  # deflate tops out near 1032:1; more is a crafted bomb
    max_total_bytes: int = 8 << 30  # declared uncompressed bytes of one archive, all members
    read_whole_below: int = 64 << 20  # members up to this size are read whole; larger ones are sniffed


@dataclass
class ZipMember:
    name: str
    data_offset: int  # where its (compressed) bytes start in the file
    compressed_bytes: int
    bytes: int
    method: int
    crc: int = 0


@dataclass
class ZipScan:
    source: str
    size: int
    members: list[ZipMember] = field(default_factory=list)
    prefix: str | None = None
    data_pkl: str | None = None
    data_pkl_sha256: str | None = None
    is_torchscript: bool = False
    storage_members: set[str] = field(default_factory=set)
    refused_members: set[str] = field(default_factory=set)  # bombs and members past the file's end
    pickles: list[PickleScan] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    by_info: dict[int, ZipMember] = field(default_factory=dict)  # id(ZipInfo) -> where its bytes are
    code_files: list[str] = field(default_factory=list)  # a TorchScript archive's code/*.py (not pickles)

    def find(self, name: str) -> str | None:
        """The member torch's reader returns for `name`: matched without regard to letter case."""
        lower = name.lower()
        return next((m.name for m in self.members if m.name.lower() == lower), None)

    @property
    def opened(self) -> bool:
        return bool(self.members)


def scan_zip_file(
    path: str | os.PathLike,
    policy: Policy | None = None,
    limits: ZipLimits | None = None,
    scan_limits: ScanLimits | None = None,
    source: str | None = None,
    ctx: ScanContext | None = None,
) -> ZipScan:
    """`scan_zip` on a file path."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return scan_zip(f, size, source or os.fspath(path), policy, limits, scan_limits, ctx=ctx)


def _problem(scan: ZipScan, code: str, member: str | None, message: str, **kw) -> None:  # noqa: D103
    where = f"{scan.source}::{member}" if member else scan.source
    scan.problems.append(Problem(code, where, message, **kw))


def _read_eocd(f: BinaryIO, size: int, scan: ZipScan, limits: ZipLimits) -> bool:
    """Check the end-of-central-directory record; False when the archive cannot be trusted to open."""
    tail_len = min(size, _EOCD_MAX_TAIL)
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    at = tail.rfind(_EOCD)
    if at < 0 or len(tail) - at < 22:
        _problem(
            scan,
            "corrupt_zip",
            None,
            "no end-of-central-directory record: the archive is truncated or not a zip, so torch.load "
            "cannot read it and its contents cannot be verified",
        )
        return False
    eocd_pos = size - tail_len + at
    _sig, _disk, _cd_disk, _n_disk, entries, cd_size, cd_offset, _comment = struct.unpack_from(
        "<4sHHHHIIH", tail, at
    )
    cd_end = eocd_pos
    saturated = entries == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF
    locator = b""
    if eocd_pos >= 20:
        f.seek(eocd_pos - 20)
        locator = f.read(20)
    if locator[:4] == _EOCD64_LOCATOR:  # torch.save always writes the zip64 records
        (eocd64_pos,) = struct.unpack_from("<Q", locator, 8)
        if eocd64_pos + 56 > eocd_pos - 20:
            _problem(
                scan, "zip_size_beyond_file", None, f"zip64 record claimed at {eocd64_pos}, past its locator"
            )
            return False
        f.seek(eocd64_pos)
        record = f.read(56)
        if record[:4] != _EOCD64:
            _problem(scan, "corrupt_zip", None, "zip64 end-of-central-directory record missing")
            return False
        entries64, cd_size64, cd_offset64 = struct.unpack_from("<QQQ", record, 32)
        if saturated:
            entries, cd_size, cd_offset = entries64, cd_size64, cd_offset64
        elif (entries64, cd_size64, cd_offset64) != (entries, cd_size, cd_offset):
            _problem(
                scan,
                "zip_records_disagree",
                None,
                "the zip64 and classic end records give different member counts or offsets; zip readers "
                "can disagree on what the archive holds",
            )
        cd_end = eocd64_pos
    elif saturated:
        _problem(scan, "corrupt_zip", None, "zip64 fields set but no zip64 locator")
        return False
    if entries > limits.max_entries:
        _problem(
            scan,
            "zip_too_many_entries",
            None,
            f"the archive claims {entries} members (limit {limits.max_entries}); refusing to list it",
        )
        return False
    if cd_offset + cd_size > size:
        _problem(
            scan,
            "zip_size_beyond_file",
            None,
            f"the central directory claims bytes {cd_offset}..{cd_offset + cd_size} of a {size}-byte file: "
            "truncated or crafted",
        )
        return False
    if cd_offset + cd_size != cd_end:
        _problem(
            scan,
            "zip_extra_data",
            None,
            f"{cd_end - cd_offset - cd_size} bytes sit between the archive start offsets and the central "
            "directory (data prepended or spliced in); zip readers can disagree on such files",
        )
    return True


def _check_name(scan: ZipScan, name: str) -> None:
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        _problem(
            scan,
            "zip_absolute_name",
            name,
            "member has an absolute path; an extracting tool would write outside its folder",
        )
    if ".." in parts:
        _problem(
            scan,
            "zip_path_traversal",
            name,
            "member name contains '..'; an extracting tool would write outside its folder",
        )
    if "\x00" in name:
        _problem(scan, "zip_bad_name", name, "member name contains a NUL byte")
    if not name:
        _problem(
            scan, "zip_bad_name", "<empty>", "a member with an empty name: zip readers disagree on what it is"
        )


def _check_members(f: BinaryIO, size: int, zf: zipfile.ZipFile, scan: ZipScan, limits: ZipLimits) -> None:
    seen: set[str] = set()
    folded: dict[str, str] = {}
    spans: list[tuple[int, int, str]] = []
    for info in zf.infolist():
        name = info.filename
        _check_name(scan, name)
        if name in seen:
            _problem(
                scan,
                "zip_duplicate_member",
                name,
                "two members share this name; zip readers differ on which one they return, so a scanner "
                "and a loader can see different data",
            )
        seen.add(name)
        if info.flag_bits & 0x1:
            _problem(scan, "zip_encrypted", name, "member is encrypted and cannot be scanned")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            _problem(
                scan,
                "zip_unsupported_compression",
                name,
                f"compression method {info.compress_type}; torch's reader handles only stored and deflate",
            )
        if info.header_offset + 30 > size:
            _problem(
                scan,
                "zip_size_beyond_file",
                name,
                f"local header claimed at offset {info.header_offset} of a {size}-byte file",
            )
            continue
        f.seek(info.header_offset)
        header = f.read(30)
        if header[:4] != _LOCAL:
            _problem(scan, "corrupt_zip", name, f"no local file header at offset {info.header_offset}")
            continue
        name_len, extra_len = struct.unpack_from("<HH", header, 26)
        local_name = f.read(name_len)
        central = info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437", "replace")
        if local_name != central:
            _problem(
                scan,
                "zip_local_name_mismatch",
                name,
                "the member's local header names a different file than the central directory: torch's reader "
                "ignores local names and Python's zipfile refuses the member, so loaders disagree about it "
                "(it was read the way torch reads it)",
            )
        data_offset = info.header_offset + 30 + name_len + extra_len
        data_end = data_offset + info.compress_size
        if data_end > size:
            _problem(
                scan,
                "zip_size_beyond_file",
                name,
                f"member claims {info.compress_size} bytes at offset {data_offset}, past the end of the "
                f"{size}-byte file (truncated or crafted)",
            )
            scan.refused_members.add(name)
            continue
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            _problem(
                scan,
                "zip_size_mismatch",
                name,
                f"stored member declares {info.file_size} bytes uncompressed but {info.compress_size} stored",
            )
        if (
            info.compress_type == zipfile.ZIP_DEFLATED
            and info.file_size > max(info.compress_size, 1) * limits.max_ratio
        ):
            _problem(
                scan,
                "zip_bomb",
                name,
                f"member inflates {info.compress_size} bytes to a declared {info.file_size} "
                f"(over {limits.max_ratio}:1): a decompression bomb; it was not decompressed",
            )
            scan.refused_members.add(name)
        if (
            info.compress_type == zipfile.ZIP_DEFLATED
            and info.compress_size > info.file_size + info.file_size // 64 + 1024
        ):
            # deflate never grows data by more than a few bytes per 16 KiB block: the size is a lie
            _problem(
                scan,
                "zip_size_lie",
                name,
                f"{info.compress_size} compressed bytes cannot deflate to the declared {info.file_size}: the header "
                "lies about the member's size (a bomb, or a file built to confuse zip readers); not decompressed",
            )
            scan.refused_members.add(name)
        spans.append((info.header_offset, data_end, name))
        member = ZipMember(
            name, data_offset, info.compress_size, info.file_size, info.compress_type, info.CRC
        )
        scan.members.append(member)
        scan.by_info[id(info)] = member
        lower = name.lower()
        if lower in folded and folded[lower] != name:
            _problem(
                scan,
                "zip_duplicate_member",
                name,
                "two members differ only in letter case; torch's reader finds names case-insensitively, so it "
                "may return either one",
            )
        folded.setdefault(lower, name)
    spans.sort()
    for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
        if start < end:
            _problem(
                scan,
                "zip_overlapping_members",
                second,
                f"member overlaps {first}; overlapping members are how quoted-overlap zip bombs and "
                "parser-confusion files are built",
            )


def read_raw_member(f: BinaryIO, member: ZipMember, limit: int) -> bytes:
    """Up to `limit` bytes of a member, read the way torch's zip reader (miniz) reads it: from the
    offset its local header gives, stored or raw deflate, with no CRC check and no comparison of
    the local name. Raises zlib.error or OSError on bytes that do not inflate."""
    f.seek(member.data_offset)
    if member.method == zipfile.ZIP_STORED:
        return f.read(min(member.compressed_bytes, limit))
    inflate = zlib.decompressobj(-15)
    out = bytearray()
    left = member.compressed_bytes
    while left and len(out) < limit:
        chunk = f.read(min(1 << 20, left, max(limit, 1 << 14)))  # a 512-byte peek reads 16 KiB, not 1 MiB
        if not chunk:
            break
        left -= len(chunk)
        out += inflate.decompress(chunk, limit - len(out))
        while inflate.unconsumed_tail and len(out) < limit:
            out += inflate.decompress(inflate.unconsumed_tail, limit - len(out))
    return bytes(out)


def _read_member(
    f: BinaryIO, info: zipfile.ZipInfo, scan: ZipScan, limits: ZipLimits, cap: int | None = None
) -> bytes | None:
    """The member's bytes as torch reads them, never more than its declared size or `cap`; a
    member that cannot be read is a problem, never skipped silently."""
    cap = limits.max_pickle_bytes if cap is None else cap
    if info.file_size > cap:
        _problem(
            scan,
            "pickle_too_large",
            info.filename,
            f"member is {info.file_size} bytes (limit {cap}); not scanned",
        )
        return None
    member = scan.by_info.get(id(info))
    if member is None:
        return None  # its header was already reported (missing, beyond the file)
    try:
        out = read_raw_member(f, member, info.file_size + 1)
    except (OSError, ValueError, zlib.error) as e:
        _problem(scan, "corrupt_zip", info.filename, f"corrupt/unreadable member: {e}")
        return None
    if len(out) != info.file_size:
        _problem(
            scan,
            "zip_size_mismatch",
            info.filename,
            f"member holds {len(out)} bytes but declares {info.file_size}",
        )
        return None
    if zlib.crc32(out) != member.crc:
        _problem(
            scan,
            "zip_bad_crc",
            info.filename,
            "the member's CRC does not match its bytes; torch's reader does not check it and loads the bytes "
            "as they are, which is what was scanned",
            severity="warning",
            blocks_safe=False,
        )
    return out


def _peek(f: BinaryIO, info: zipfile.ZipInfo, scan: ZipScan, n: int = 512) -> bytes | None:
    """The first `n` bytes as torch reads them; None (and a problem) when they cannot be read."""
    member = scan.by_info.get(id(info))
    if member is None:
        return None
    try:
        return read_raw_member(f, member, min(n, max(info.file_size, 0)))
    except (OSError, ValueError, zlib.error) as e:
        _problem(scan, "corrupt_zip", info.filename, f"corrupt/unreadable member: {e}")
        return None


# what zipfile raises on hostile bytes: version needed 255 (NotImplementedError), an empty name
# (IndexError in ZipInfo.is_dir), a negative seek (ValueError), a bad deflate stream (zlib.error)
_READER_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    OSError,
    EOFError,
    ValueError,
    struct.error,
    NotImplementedError,
    IndexError,
    KeyError,
    OverflowError,
    RuntimeError,
    zlib.error,
)


def scan_zip(
    f: BinaryIO,
    size: int,
    source: str,
    policy: Policy | None = None,
    limits: ZipLimits | None = None,
    scan_limits: ScanLimits | None = None,
    nested=None,
    ctx: ScanContext | None = None,
    depth: int = 0,
) -> ZipScan:
    """Check the archive's structure, then scan data.pkl and every other member by its content."""
    limits = limits or ZipLimits()
    if ctx is None:
        ctx = ScanContext(policy or Policy(), scan_limits or ScanLimits(), nested=nested)
    policy, scan_limits, nested = ctx.policy, ctx.limits, ctx.nested
    scan = ZipScan(source=source, size=size)
    if not _read_eocd(f, size, scan, limits):
        return scan
    f.seek(0)
    try:
        zf = zipfile.ZipFile(f)
    except _READER_ERRORS as e:
        _problem(
            scan,
            "corrupt_zip",
            None,
            f"corrupt/unreadable: the archive cannot be opened ({type(e).__name__}: {e})",
        )
        return scan
    with zf:
        try:
            _scan_open_zip(f, size, zf, scan, limits, ctx, depth)
        except _READER_ERRORS as e:
            _problem(scan, "corrupt_zip", None, f"corrupt/unreadable: {type(e).__name__}: {str(e)[:200]}")
    return scan


def _scan_open_zip(
    f: BinaryIO,
    size: int,
    zf: zipfile.ZipFile,
    scan: ZipScan,
    limits: ZipLimits,
    ctx: ScanContext,
    depth: int,
) -> None:
    policy, scan_limits, nested, source = ctx.policy, ctx.limits, ctx.nested, scan.source
    _check_members(f, size, zf, scan, limits)
    infos = zf.infolist()
    if not infos:
        _problem(scan, "corrupt_zip", None, "the archive has no members")
        return
    first = infos[0].filename
    scan.prefix = first.split("/", 1)[0] if "/" in first else ""
    wanted = f"{scan.prefix}/data.pkl" if scan.prefix else "data.pkl"
    data_name = scan.find(wanted) or wanted  # torch's reader matches names without regard to case
    by_name = {i.filename: i for i in infos}
    constants = f"{scan.prefix}/constants.pkl" if scan.prefix else "constants.pkl"
    scan.is_torchscript = scan.find(constants) is not None
    if scan.is_torchscript:  # its pickles name its compiled classes: see Policy.torchscript
        ctx = dataclasses.replace(ctx, policy=dataclasses.replace(ctx.policy, torchscript=True))
        policy = ctx.policy
    scanned: set[int] = set()
    declared = sum(i.file_size for i in infos if i.filename not in scan.refused_members)
    if declared > limits.max_total_bytes:
        _problem(
            scan,
            "zip_too_large_to_scan",
            None,
            f"the members declare {declared} bytes uncompressed (limit {limits.max_total_bytes}); "
            "members past the limit were not scanned",
        )
    if data_name in by_name and data_name not in scan.refused_members:
        scan.data_pkl = data_name
        info = by_name[data_name]
        data = _read_member(f, info, scan, limits)
        if data is not None:
            scan.data_pkl_sha256 = hashlib.sha256(data).hexdigest()
            result = scan_pickle(data, f"{source}::{data_name}", policy, scan_limits, nested=nested)
            scan.pickles.append(result)
            for pid in result.persistent_ids:
                if len(pid) >= 3 and pid[0] == "storage":
                    key = f"{scan.prefix}/data/{pid[2]}" if scan.prefix else f"data/{pid[2]}"
                    scan.storage_members.add(scan.find(key) or key)
        scanned.add(id(info))
    else:
        _problem(
            scan,
            "zip_no_data_pkl",
            None,
            f"no {data_name}: not an archive torch.save wrote (torch.load cannot read it); every member "
            "was scanned by its content",
            severity="info",
            blocks_safe=False,
        )
    for key in sorted(scan.storage_members):
        if key not in by_name:
            _problem(
                scan,
                "zip_missing_storage",
                key,
                "data.pkl refers to this storage record but the archive lacks it; torch.load will fail",
                blocks_safe=False,
            )
    code_dir = f"{scan.prefix}/code/".lower() if scan.prefix else "code/"
    for info in infos:
        if (
            scan.is_torchscript
            and info.filename.lower().startswith(code_dir)
            and info.filename.endswith(".py")
        ):
            scan.code_files.append(info.filename)  # TorchScript source torch.jit.load compiles: code
            continue
        if (
            id(info) in scanned
            or info.filename in scan.storage_members
            or info.filename in scan.refused_members
            or info.is_dir()
        ):
            continue
        _scan_member(f, info, scan, limits, ctx, depth)


def _scan_member(
    f: BinaryIO, info: zipfile.ZipInfo, scan: ZipScan, limits: ZipLimits, ctx: ScanContext, depth: int
) -> None:
    """Scan one member by content (pickle, .npy, nested archive, compressed stream, or data)."""
    where = f"{scan.source}::{info.filename}"
    head = _peek(f, info, scan, 512)
    if not head:
        return  # empty, or unreadable (reported by _peek)
    kind = kind_of(head)
    if kind in ("data", "safetensors"):
        return
    size = info.file_size
    if size > limits.read_whole_below and kind in ("pickle", "npy"):
        # sniff a large member first: raw tensor bytes that merely start like a pickle stop early
        head = _peek(f, info, scan, limits.read_whole_below) or b""
        if kind == "npy":
            found = scan_blob(head, where, ctx, depth)
            if not found.pickles and not found.problems:
                return  # plain-dtype array: the header is all that matters
        else:
            sniff = scan_pickle(head, where, ctx.policy, ctx.limits, nested=ctx.nested)
            if not (sniff.truncated or sniff.unsafe_total or sniff.complete or sniff.limit_hit):
                return  # stops on a bad opcode before importing anything: not a pickle
    if not ctx.spend(size):
        _problem(
            scan,
            "scan_budget_exhausted",
            info.filename,
            "the scan's decompression budget is spent (many or huge members); this member was not scanned",
        )
        return
    data = _read_member(f, info, scan, limits, cap=ctx.max_blob_bytes)
    if data is None:
        return
    found = scan_blob(data, where, ctx, depth)
    scan.pickles.extend(found.pickles)
    scan.problems.extend(found.problems)


def scan_zip_bytes(data: bytes, source: str, policy: Policy | None = None, **kw) -> ZipScan:
    """`scan_zip` on an archive held in memory (a DCP item, bytes inside a pickle)."""
    return scan_zip(io.BytesIO(data), len(data), source, policy, **kw)

"""Scan any bytes by what they are, not by their name: pickles, archives, .npy, compressed streams.

Use:

    kind = kind_of(head)          # from the first 512 bytes: "zip", "npy", "tar", "gzip", "7z", ...
    found = scan_blob(data, "model.pt2::archive/data/sample_inputs/model.pt", ctx)
    found.pickles, found.problems

Every archive member and every file of a folder comes through here, so a pickle is found
whatever it is called: a zip member named `data/999`, a `.npy` whose dtype holds objects (its
data is a pickle that `np.load(allow_pickle=True)` runs), a joblib file compressed with zlib,
gzip, bz2 or xz, a torch archive nested in another (torch.export's `.pt2` holds
`data/sample_inputs/model.pt`; pickled weights and constants there are read back with
torch.load(weights_only=False)), a tar member. Archives nest up to `ScanContext.max_depth`
levels, and every decompressed byte counts against one shared budget, so a nested or
compressed bomb ends as a problem, not as memory.

What cannot be read with the standard library (7z, RAR, zstd, lz4) is reported as an unscanned
archive, which blocks a safe verdict: a loader with the right package would read it.

A blob whose first byte is no pickle opcode, or whose parse stops before reaching anything an
unpickler would import or call, is data: `pickle.load` would fail on it having run nothing.
Pass `strict=True` for a file a loader will certainly unpickle (a `.pkl` given by name): there
a parse that stops early makes the stream unverifiable.
"""

from __future__ import annotations

import bz2
import io
import lzma
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch_skills.checkpoint.allowlist import Policy
from torch_skills.checkpoint.npy_format import MAGIC as NPY_MAGIC
from torch_skills.checkpoint.npy_format import header_problem, read_npy_header
from torch_skills.checkpoint.pickle_scan import _OPS, PickleScan, ScanLimits, scan_pickle
from torch_skills.checkpoint.problems import Problem

UNSCANNED_ARCHIVES = {
    b"7z\xbc\xaf\x27\x1c": "7z",
    b"Rar!\x1a\x07": "RAR",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"\x04\x22\x4d\x18": "lz4",
}
COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz", b"\x5d\x00\x00": "lzma"}


@dataclass
class ScanContext:
    """Policy, bounds and the shared decompression budget of one scan."""

    policy: Policy = field(default_factory=Policy)
    limits: ScanLimits = field(default_factory=ScanLimits)
    max_depth: int = 4  # archives inside archives
    max_blob_bytes: int = 1 << 30  # one member or decompressed stream held in memory
    budget: list[int] = field(default_factory=lambda: [4 << 30])  # decompressed bytes, all archives
    nested: Callable | None = None  # scanner for bytes handed to pickle.loads & co.

    def spend(self, n: int) -> bool:
        """Take n bytes from the budget; False when it is exhausted."""
        if n > self.budget[0]:
            return False
        self.budget[0] -= n
        return True


@dataclass
class BlobScan:
    kind: str
    pickles: list[PickleScan] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def _zlib_header(head: bytes) -> bool:
    return len(head) >= 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and (head[0] << 8 | head[1]) % 31 == 0


def kind_of(head: bytes) -> str:
    """What the first bytes (512 or all, when shorter) say the blob is."""
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[:6] == NPY_MAGIC:
        return "npy"
    if head[257:262] == b"ustar" or is_tar_header(head):
        return "tar"
    for magic, name in UNSCANNED_ARCHIVES.items():
        if head.startswith(magic):
            return f"unscanned:{name}"
    for magic, name in COMPRESSED.items():
        if head.startswith(magic):
            return name
    if len(head) >= 9 and head[8:9] == b"{":
        return "safetensors"
    if _zlib_header(head):
        return "zlib"
    if head and _OPS[head[0]] is not None:
        return "pickle"
    return "data"


def is_tar_header(head: bytes) -> bool:
    """True when the first 512 bytes are a tar header Python's tarfile accepts (the checks of
    TarInfo.frombuf: not all NUL, the octal or base-256 checksum matching the signed or unsigned
    byte sum), with or without the ustar magic: torch.load hands any non-zip file to tarfile first,
    so an old v7 header whose name field happens to be a pickle still opens as a tar there."""
    if len(head) < 512 or head[:512].count(0) == 512:
        return False
    field = head[148:156]
    if field[0] in (0o200, 0o377):
        value = 0
        for byte in field[1:]:
            value = (value << 8) + byte
        if field[0] == 0o377:
            value = -((256 ** (len(field) - 1)) - value)
    else:
        text = field.split(b"\0", 1)[0]
        try:
            value = int(text.decode("ascii").strip() or "0", 8)
        except (UnicodeDecodeError, ValueError):
            return False
    block = head[:512]
    unsigned = 256 + sum(block[:148]) + sum(block[156:512])
    signed = 256 + sum(b - 256 if b > 127 else b for b in block[:148] + block[156:512])
    return value in (unsigned, signed)


class TooBig(ValueError):
    """Decompression stopped at its cap or its ratio limit."""


MAX_STREAM_RATIO = 200  # output per input byte; joblib-compressed weights stay far below it


def decompress(kind: str, data: Any, cap: int) -> bytes:
    """Decompress in pieces; TooBig past `cap` bytes or past MAX_STREAM_RATIO times the input read."""
    view = memoryview(data).cast("B")
    out = bytearray()
    step = 1 << 16

    def check(consumed: int) -> None:
        if len(out) > cap:
            raise TooBig(f"it decompresses to more than {cap} bytes")
        if len(out) > MAX_STREAM_RATIO * consumed + (1 << 20):
            raise TooBig(f"it inflates more than {MAX_STREAM_RATIO}:1 (a decompression bomb)")

    if kind in ("zlib", "gzip"):
        d = zlib.decompressobj(zlib.MAX_WBITS | 16 if kind == "gzip" else zlib.MAX_WBITS)
        for start in range(0, len(view), step):
            chunk = view[start : start + step]
            while chunk:
                out += d.decompress(chunk, step * 4)
                check(start + step)
                chunk = d.unconsumed_tail
            if d.eof:
                break
    else:
        d = bz2.BZ2Decompressor() if kind == "bz2" else lzma.LZMADecompressor()
        for start in range(0, len(view), step):
            out += d.decompress(view[start : start + step], step * 4)
            check(start + step)
            while not d.eof and not d.needs_input:
                out += d.decompress(b"", step * 4)
                check(start + step)
            if d.eof:
                break
    if not d.eof:
        raise EOFError(f"the {kind} stream ends early (truncated)")
    return bytes(out)


def _pickle(data: Any, source: str, ctx: ScanContext, strict: bool) -> BlobScan:
    scan = scan_pickle(data, source, ctx.policy, ctx.limits, nested=ctx.nested)
    if strict or scan.unsafe_total or scan.complete or scan.limit_hit or scan.frame_crossings:
        return BlobScan("pickle", [scan])
    return BlobScan("data")  # stops before importing or calling anything: nothing would run


def scan_blob(data: Any, source: str, ctx: ScanContext, depth: int = 0, strict: bool = False) -> BlobScan:
    """Scan bytes held in memory (an archive member, a decompressed stream) by their content."""
    kind = kind_of(bytes(data[:512]))
    if kind == "pickle":
        return _pickle(data, source, ctx, strict)
    if kind == "npy":
        return scan_npy(data, source, ctx)
    if kind.startswith("unscanned:"):
        return BlobScan(kind, problems=[unscanned_problem(kind, source)])
    if kind in ("zip", "tar") or kind in COMPRESSED.values() or kind == "zlib":
        if depth >= ctx.max_depth:
            return BlobScan(
                kind,
                problems=[
                    Problem(
                        "archive_too_deep",
                        source,
                        f"archives nest more than {ctx.max_depth} levels here; the inner ones were not scanned",
                    )
                ],
            )
        if kind == "zip":
            from torch_skills.checkpoint.zip_scan import scan_zip  # zip_scan calls back into this module

            z = scan_zip(io.BytesIO(bytes(data)), len(data), source, ctx=ctx, depth=depth + 1)
            return BlobScan("zip", z.pickles, z.problems)
        if kind == "tar":
            from torch_skills.checkpoint.tar_scan import scan_tar

            t = scan_tar(io.BytesIO(bytes(data)), source, ctx, depth + 1)
            return BlobScan("tar", t.pickles, t.problems)
        return scan_compressed(kind, data, source, ctx, depth, strict)
    return BlobScan(kind)


def scan_compressed(
    kind: str, data: Any, source: str, ctx: ScanContext, depth: int, strict: bool
) -> BlobScan:
    cap = min(ctx.max_blob_bytes, ctx.budget[0])
    try:
        inner = decompress(kind, data, cap)
    except TooBig as e:
        return BlobScan(
            kind,
            problems=[
                Problem(
                    "decompression_limit",
                    source,
                    f"a {kind} stream that {e} (a bomb, or too large to scan); its contents were not scanned",
                )
            ],
        )
    except (ValueError, OSError, EOFError, zlib.error, lzma.LZMAError) as e:
        return _corrupt_compressed(kind, data, source, ctx, strict, e)
    ctx.spend(len(inner))
    found = scan_blob(inner, f"{source} ({kind}-decompressed)", ctx, depth + 1, strict=strict)
    return BlobScan(kind, found.pickles, found.problems)


def _corrupt_compressed(
    kind: str, data: Any, source: str, ctx: ScanContext, strict: bool, e: Exception
) -> BlobScan:
    if kind == "zlib":  # two bytes that only looked like a zlib header: try it as anything else
        return _pickle(data, source, ctx, strict) if _OPS[data[0]] is not None else BlobScan("data")
    return BlobScan(
        kind,
        problems=[Problem("corrupt_compressed", source, f"corrupt/unreadable {kind} stream: {str(e)[:200]}")],
    )


def unscanned_problem(kind: str, source: str) -> Problem:
    name = kind.split(":", 1)[1]
    return Problem(
        "unscanned_archive",
        source,
        f"a {name} archive: the standard library cannot read it, so its contents were not scanned and it is "
        "not safe to call safe. Unpack it with a trusted tool and verify the files inside",
    )


def scan_npy(data: Any, source: str, ctx: ScanContext) -> BlobScan:
    """A .npy: raw array bytes (safe data), or an object array whose data is a pickle."""
    header = read_npy_header(bytes(data[: (1 << 20) + 16]))
    if not header.ok:
        return BlobScan("npy", problems=[header_problem(header, source)])
    if header.has_object:
        scan = scan_pickle(
            data,
            f"{source} (object array)",
            ctx.policy,
            ctx.limits,
            nested=ctx.nested,
            start=header.data_offset,
        )
        return BlobScan("npy", [scan])
    found = BlobScan("npy")
    expected = header.nbytes
    if expected is not None and len(data) - header.data_offset < expected:
        found.problems.append(
            Problem(
                "npy_truncated",
                source,
                f"corrupt/unreadable .npy: shape {header.shape} of {header.descr} needs {expected} bytes, "
                f"{len(data) - header.data_offset} follow the header",
            )
        )
    return found

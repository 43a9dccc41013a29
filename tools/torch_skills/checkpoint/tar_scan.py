"""Scan every member of a tar archive by its content (torch < 0.4 checkpoints, packed model folders).

Use:

    found = scan_tar(fileobj, "model.tar", ctx, depth=1)     # TarScan(pickles, problems, members)

Members are listed from their 512-byte headers (bounded count); each regular file is read whole
(bounded by the context's per-blob cap and shared budget) and handed to
`torch_skills.checkpoint.blob_scan.scan_blob`, so pickles, nested archives, .npy object arrays and
compressed streams are found whatever the member is called. torch's own pre-0.4 layout
(`sys_info`, `pickle`, `storages`, `tensors`) is recognised by any of the members torch reads
(`pickle`, `storages`, `tensors`), whatever else is in the archive: its `storages` member interleaves
pickles with raw storage bytes whose boundaries the scan cannot follow, so such an archive is
never called safe (the payloads that are found are still named).
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass, field
from typing import BinaryIO

from torch_skills.checkpoint.blob_scan import ScanContext, scan_blob
from torch_skills.checkpoint.pickle_scan import PickleScan
from torch_skills.checkpoint.problems import Problem

MAX_MEMBERS = 100_000
TORCH_LEGACY_TAR = {"sys_info", "pickle", "storages", "tensors"}


@dataclass
class TarScan:
    pickles: list[PickleScan] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    members: list[str] = field(default_factory=list)
    torch_legacy: bool = False


def scan_tar(f: BinaryIO, source: str, ctx: ScanContext, depth: int = 1) -> TarScan:
    """List and scan the members; every reader error becomes a 'corrupt/unreadable' problem."""
    out = TarScan()
    try:
        with tarfile.open(fileobj=f, mode="r:") as tar:
            for count, info in enumerate(tar):
                if count >= MAX_MEMBERS:
                    out.problems.append(
                        Problem(
                            "tar_too_many_members",
                            source,
                            f"more than {MAX_MEMBERS} members; the rest were not scanned",
                        )
                    )
                    break
                out.members.append(info.name)
                where = f"{source}::{info.name}"
                if ".." in info.name.replace("\\", "/").split("/") or info.name.startswith("/"):
                    out.problems.append(
                        Problem(
                            "tar_path_traversal", where, "member name leaves the folder it is extracted to"
                        )
                    )
                if not info.isfile():
                    continue
                if info.size > ctx.max_blob_bytes or not ctx.spend(info.size):
                    out.problems.append(
                        Problem(
                            "tar_member_too_large",
                            where,
                            f"{info.size} bytes: over the scan's limits; not scanned",
                        )
                    )
                    continue
                member = tar.extractfile(info)
                data = member.read(info.size + 1) if member is not None else b""
                if len(data) != info.size:
                    out.problems.append(
                        Problem(
                            "corrupt_tar",
                            where,
                            f"corrupt/unreadable: holds {len(data)} of {info.size} bytes",
                        )
                    )
                    continue
                found = scan_blob(data, where, ctx, depth)
                out.pickles.extend(found.pickles)
                out.problems.extend(found.problems)
    except (tarfile.TarError, OSError, EOFError, ValueError, UnicodeDecodeError) as e:
        out.problems.append(Problem("corrupt_tar", source, f"corrupt/unreadable tar archive: {str(e)[:200]}"))
    names = {m.rsplit("/", 1)[-1] for m in out.members}
    # torch's legacy_load extracts "storages", "tensors" and "pickle" by name and ignores the rest,
    # so one of them is enough, whatever else the archive holds
    if names & TORCH_LEGACY_TAR - {"sys_info"}:
        out.torch_legacy = True
        out.problems.append(
            Problem(
                "legacy_tar_format",
                source,
                "a tar-format checkpoint from torch < 0.4: its storages member mixes pickles with raw bytes the "
                "scan cannot delimit, so it is never called safe. Load it once in a sandbox and re-save it with "
                "torch.save",
            )
        )
    return out

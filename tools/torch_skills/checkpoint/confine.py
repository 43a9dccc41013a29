"""Keep every file a scan or a load opens inside the checked folder and the allowed roots.

Use:

    confine = Confinement.of(Path("ckpt_dir"), allowed_roots)   # allowed_roots: the job's roots (may be empty)
    real = confine.resolve(Path("ckpt_dir/model-00001.safetensors"))   # the resolved path, or None
    confine.refusal(path, source)    # the Problem to report for a path that leaves them

A checkpoint names other files (a sharded index its shards, a DCP `.metadata` its `.distcp` files)
and a folder may hold symbolic links: each path is resolved (links followed, `..` collapsed) and
must land inside the checked folder and, when the job has allowed roots, inside one of them. A
path that does not is refused before it is opened, and the problem names only the checkpoint's
own entry, never the outside target, so nothing of an outside file reaches a message.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from torch_skills.checkpoint.problems import Problem


@dataclass(frozen=True)
class Confinement:
    folder: Path  # resolved: the checked folder (a single file's parent)
    roots: tuple[Path, ...] = ()  # resolved allowed roots; empty: only the folder is checked

    @classmethod
    def of(cls, folder: Path, roots: Iterable[str | os.PathLike] = ()) -> Confinement:
        return cls(Path(folder).resolve(), tuple(Path(r).resolve() for r in roots))

    def resolve(self, path: Path) -> Path | None:
        """`path` resolved, or None when it leaves the folder or every allowed root."""
        try:
            real = Path(path).resolve()
        except (OSError, RuntimeError):  # a link loop
            return None
        if not real.is_relative_to(self.folder):
            return None
        if self.roots and not any(real.is_relative_to(r) for r in self.roots):
            return None
        return real

    def refusal(self, entry: str, source: str) -> Problem:
        return Problem(
            "outside_checked_folder",
            source,
            f"{entry} resolves outside the checked folder or the allowed roots (a link or a '..' path); "
            "it was refused and not read, so the checkpoint cannot be called safe",
        )

"""A clean copy of this repository, for tests that build or install it (never build in the clone).

Use `copy_repository(dest)`: copies the working tree without git data, virtual environments,
build outputs and caches, and returns the copy's root. `copy_checkout(dest)` copies only what a
fresh `git clone` of the working tree would hold (tracked files and new files git does not ignore).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache",
    ".checkpoint-corpus-*", ".demo", "results", "report.md",
)  # fmt: skip


def copy_repository(dest: Path) -> Path:
    """Copy the clone's working tree to `dest/torch-skills` and return that folder."""
    root = dest / "torch-skills"
    shutil.copytree(REPO, root, ignore=NOT_COPIED)
    return root


def copy_checkout(dest: Path) -> Path:
    """Copy the files a clean clone would have (`git ls-files`: tracked, plus untracked not ignored)."""
    root = dest / "torch-skills"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return root

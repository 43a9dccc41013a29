"""A clean copy of this repository, for tests that build or install it (never build in the clone).

Use `copy_repository(dest)`: copies the working tree without git data, virtual environments,
build outputs and caches, and returns the copy's root.
"""

from __future__ import annotations

import shutil
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

"""Allowed roots: which paths the user's agent may point the torch tools at.

Use `AllowedRoots(cwd, extra=[...]).with_client_roots(uris).check(path)`: it returns the resolved
path or raises `PathNotAllowed`, whose message names the allowed roots and how to add one. Roots
are the server's working directory, every `--allow DIR` flag, and the client's MCP roots when it
offers them. Symlinks are resolved before the check, so a link inside a root that points outside
it is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse


class PathNotAllowed(ValueError):
    """A path outside every allowed root."""


@dataclass(frozen=True)
class AllowedRoots:
    cwd: Path
    extra: tuple[Path, ...] = ()
    client: tuple[Path, ...] = field(default=())

    @property
    def all(self) -> tuple[Path, ...]:
        seen: dict[Path, None] = {}
        for root in (self.cwd, *self.extra, *self.client):
            seen.setdefault(Path(os.path.realpath(root)), None)
        return tuple(seen)

    def with_client_roots(self, uris: list[str]) -> AllowedRoots:
        """Add the client's `file://` roots (others are ignored)."""
        paths = []
        for uri in uris:
            parsed = urlparse(str(uri))
            if parsed.scheme == "file":
                paths.append(Path(unquote(parsed.path)))
        return AllowedRoots(self.cwd, self.extra, tuple(paths))

    def resolve(self, path: str | Path) -> Path:
        """Absolute, symlink-free form of `path`, relative paths taken from the working directory."""
        p = Path(path).expanduser()
        if not p.is_absolute():
            p = self.cwd / p
        return Path(os.path.realpath(p))

    def contains(self, path: str | Path) -> bool:
        """Whether `path` (resolved) lies under one of the roots."""
        resolved = self.resolve(path)
        return any(resolved == root or resolved.is_relative_to(root) for root in self.all)

    def check(self, path: str | Path) -> Path:
        """Return the resolved path if it lies under an allowed root, else raise PathNotAllowed."""
        if self.contains(path):
            return self.resolve(path)
        roots = ", ".join(str(r) for r in self.all)
        raise PathNotAllowed(
            f"{path} is outside the allowed roots ({roots}). Move the file under one of them, "
            "or restart the server with --allow DIR (or add the folder as a root in your MCP client)."
        )

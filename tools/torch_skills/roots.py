"""Allowed roots: which paths the user's agent may point the torch tools at.

Use `AllowedRoots(cwd, extra=[...]).with_client_roots(uris).check(path)`: it returns the resolved
path or raises `PathNotAllowed`, whose message names the allowed roots and how to add one. Roots
are every `--allow DIR` flag, the client's MCP roots when it offers them, and the server's working
directory when it is a project folder. Symlinks are resolved before the check, so a link inside a
root that points outside it is refused.

A folder that holds far more than one project is never a root: the file system root, the home
directory and its parents, the temp folder itself and system folders (/usr, /etc, /proc, ...).
Desktop clients often start servers in `/` or `~`; that working directory then counts for
nothing and the error says so. `--allow` with such a folder raises `RootTooBroad` at start-up;
a client root of that kind is ignored.

Known limitations: "project folder" means "not one of the folders above"; a working directory
such as /srv or /data that happens to hold many projects still counts.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from torch_skills.userspec import BadName, check_name


class PathNotAllowed(ValueError):
    """A path outside every allowed root."""


class RootTooBroad(ValueError):
    """A folder asked to be a root that holds far more than a project (/, ~, a system folder)."""


# Folders whose whole subtree belongs to the system: never a root, nor anything under them.
_SYSTEM_TREES = (
    "/proc",
    "/sys",
    "/dev",
    "/boot",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
)
# Folders that hold many unrelated things: never a root themselves (a folder inside them may be).
_SHARED_FOLDERS = (
    "/",
    "/home",
    "/Users",
    "/root",
    "/tmp",
    "/var",
    "/var/tmp",
    "/opt",
    "/srv",
    "/mnt",
    "/media",
    "/run",
    "/snap",
    "/private",
    "/private/tmp",
    "/Volumes",
)


def too_broad(folder: str | Path) -> str | None:
    """Why `folder` cannot be a root ("the file system root", "your home directory", ...), or None."""
    real = Path(os.path.realpath(folder))
    home = Path(os.path.realpath(Path.home()))
    if real == Path(real.anchor):
        return "the file system root"
    if real == home or home.is_relative_to(real):
        return "your home directory" if real == home else f"a parent of your home directory ({home})"
    if real == Path(os.path.realpath(tempfile.gettempdir())):
        return "the temp folder itself"
    for tree in _SYSTEM_TREES:
        if real == Path(tree) or real.is_relative_to(tree):
            return f"a system folder ({tree})"
    if str(real) in _SHARED_FOLDERS:
        return f"a shared system folder ({real})"
    return None


@dataclass(frozen=True)
class AllowedRoots:
    cwd: Path
    extra: tuple[Path, ...] = ()
    client: tuple[Path, ...] = field(default=())

    def __post_init__(self) -> None:
        for root in self.extra:
            why = too_broad(root)
            if why is not None:
                raise RootTooBroad(
                    f"--allow {root} is refused: it is {why}, which would let the tools read and run any file "
                    "there. Allow the project folder itself (e.g. --allow ~/code/myproject)."
                )

    @property
    def cwd_is_root(self) -> bool:
        """Whether the working directory counts as a root (it is a project, not / or ~ or /usr...)."""
        return too_broad(self.cwd) is None

    @property
    def all(self) -> tuple[Path, ...]:
        seen: dict[Path, None] = {}
        own = (self.cwd,) if self.cwd_is_root else ()
        for root in (*own, *self.extra, *self.client):
            seen.setdefault(Path(os.path.realpath(root)), None)
        return tuple(seen)

    def with_client_roots(self, uris: list[str]) -> AllowedRoots:
        """Add the client's `file://` roots (others, and too-broad folders such as / or ~, are ignored)."""
        paths = []
        for uri in uris:
            parsed = urlparse(str(uri))
            if parsed.scheme == "file":
                path = unquote(parsed.path)
                try:
                    check_name(path, "a client root")
                except BadName:
                    continue
                if too_broad(path) is None:
                    paths.append(Path(path))
        return AllowedRoots(self.cwd, self.extra, tuple(paths))

    @property
    def base(self) -> Path:
        """The folder relative paths start from and user code runs in: the working directory when it is
        a root, else the first --allow or client root (a desktop client starts the server in / or ~)."""
        if self.cwd_is_root:
            return self.cwd
        others = [*self.extra, *self.client]
        return Path(others[0]) if others else self.cwd

    def resolve(self, path: str | Path) -> Path:
        """Absolute, symlink-free form of `path`. A relative path starts from `base`; when the working
        directory is not a root, the first root that holds the path wins."""
        check_name(str(path))
        try:
            p = Path(path).expanduser()
        except RuntimeError:  # '~name' for a user this machine does not know
            raise BadName(f"{path}: '~' names no known user's home here; give the full path") from None
        if not p.is_absolute():
            candidates = [self.base] if self.cwd_is_root else [*self.extra, *self.client] or [self.cwd]
            p = next((Path(c) / p for c in candidates if (Path(c) / p).exists()), Path(candidates[0]) / p)
        return Path(os.path.realpath(p))

    def contains(self, path: str | Path) -> bool:
        """Whether `path` (resolved) lies under one of the roots; False for names no file can have."""
        try:
            resolved = self.resolve(path)
        except (BadName, ValueError, OSError):
            return False
        return any(resolved == root or resolved.is_relative_to(root) for root in self.all)

    def check(self, path: str | Path) -> Path:
        """Return the resolved path if it lies under an allowed root, else raise PathNotAllowed.

        A path no file can have (NUL, overlong, not UTF-8) raises BadName instead."""
        check_name(str(path))
        if self.contains(path):
            return self.resolve(path)
        raise PathNotAllowed(f"{path} is outside the allowed roots. {self.explain()}")

    def explain(self) -> str:
        """The allowed roots and how to add one (and why the working directory is not one, if not)."""
        roots = ", ".join(str(r) for r in self.all) or "none"
        text = f"Allowed roots: {roots}."
        if not self.cwd_is_root:
            text += (
                f" The server's working directory {self.cwd} is {too_broad(self.cwd)}, so it is not a root: "
                "start the server from the project folder (set `cwd` in the client's server config)"
                " or pass --allow DIR."
            )
        return (
            text + " Move the file under a root, restart the server with --allow DIR, "
            "or add the folder as a root in your MCP client."
        )

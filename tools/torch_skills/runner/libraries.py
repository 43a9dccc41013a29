"""Installed libraries the user's code imports, learned per call and imported once in the warm worker.

Use it on both sides of the fork:

    before = set(sys.modules)                   # child, at start
    ...
    names = installed_imports(before)           # child, at the end: goes back with the result
    import_when_idle(names) -> problem | None   # zygote, when no job runs (see zygote.py)

Every tool call runs in a fresh fork of the warm worker, so a library the user's model imports
(transformers, timm, ...) would be imported again by every call: seconds each time. The child
reports the modules it imported from the interpreter's site-packages; the pool passes the new
ones to the warm worker, which imports them between jobs, so the next child starts with them.

Only installed third-party modules qualify (their files under site-packages/dist-packages):
never the user's project files, which change between calls, never torch-skills' own. fork() is
only safe from a single thread, so the worker counts its threads after the import; a library
that leaves one running makes the worker exit (the pool restarts it and never preloads that
library again).

Known limitations: a library reinstalled while the server runs stays at the version the warm
worker imported until the server restarts.
"""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
from pathlib import Path

_OWN_DIR = str(Path(__file__).resolve().parents[1])
MAX_MODULES = 5000  # a bound on what one call can ask the warm worker to import


def _site_dirs() -> tuple[str, ...]:
    dirs = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    for entry in sys.path:
        if entry.endswith(("site-packages", "dist-packages")):
            dirs.add(os.path.realpath(entry))
    return tuple(sorted(dirs))


def installed_imports(before: set[str]) -> list[str]:
    """Modules imported since `before` whose files live in site-packages (torch and torch-skills aside)."""
    sites = _site_dirs()
    names = []
    for name in set(sys.modules) - before:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if not path or name.split(".")[0] in ("torch", "torch_skills", "__main__"):
            continue
        real = os.path.realpath(path)
        if real.startswith(_OWN_DIR) or not real.startswith(sites):
            continue
        names.append(name)
    return sorted(names)[:MAX_MODULES]


def thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def import_all(names: list[str]) -> str | None:
    """Import `names` (parents first); the reason fork would be unsafe afterwards, or None."""
    threads = thread_count()
    for name in sorted(names, key=lambda n: n.count(".")):
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - a module that fails alone is simply not preloaded
            continue
    if thread_count() > threads:
        return f"importing {names[0].split('.')[0]} started a thread"
    return None

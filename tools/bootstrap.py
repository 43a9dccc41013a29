"""Make this folder importable as `torch_skills`, whatever it is called on disk.

Use it two ways:
    python path/to/torch_skills/bootstrap.py runner.zygote --preload ...   # run a module's main()
    load this file and call `import_package()`                              # from a clone's server.py

In a clone the package's folder is `tools/`; installed it is `site-packages/torch_skills/`. Both
import as `torch_skills`, so the worker, the server and the tests name modules one way. Run as a
script, it takes its own folder off `sys.path` first: the package's module names (`errors`,
`child`, ...) must never shadow the user's modules.

This file imports nothing of the package at module level: it runs before the package exists.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

PACKAGE = "torch_skills"
PACKAGE_DIR = Path(__file__).resolve().parent


def import_package() -> ModuleType:
    """Import `torch_skills` from this folder (once); return the package module."""
    existing = sys.modules.get(PACKAGE)
    if existing is not None:
        return existing
    spec = importlib.util.spec_from_file_location(
        PACKAGE, PACKAGE_DIR / "__init__.py", submodule_search_locations=[str(PACKAGE_DIR)]
    )
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    try:
        spec.loader.exec_module(package)
    except BaseException:
        del sys.modules[PACKAGE]
        raise
    return package


# Folders (os.pathsep-separated) appended to sys.path when run as a script: the server's copies
# of the worker's few dependencies when the worker runs under the user's interpreter. Appended,
# never prepended, so the user's own copies win (torch_skills.runner.interpreter).
WORKER_PATH_ENV = "TORCH_SKILLS_WORKER_PATH"


def _run_module_main(argv: list[str]) -> int:
    own_dirs = {str(PACKAGE_DIR), str(Path(__file__).parent)}
    sys.path[:] = [p for p in sys.path if p not in own_dirs]
    extra = [p for p in os.environ.get(WORKER_PATH_ENV, "").split(os.pathsep) if p]
    sys.path.extend(p for p in extra if p not in sys.path)
    import_package()
    module = importlib.import_module(f"{PACKAGE}.{argv[0]}")
    sys.argv = [f"{PACKAGE}.{argv[0]}", *argv[1:]]
    return int(module.main() or 0)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: bootstrap.py MODULE [ARGS...]   (MODULE inside torch_skills, e.g. runner.zygote)")
    sys.exit(_run_module_main(sys.argv[1:]))

"""Build real second Python environments for the interpreter tests, in a temp folder, offline.

Use `make_env(folder, with_torch=True, packages={"only_here": "VALUE = 1\n"})`: a venv made with
`python -m venv --without-pip` from the test's interpreter. torch comes from the test's own
environment through a .pth file naming a folder of links to torch and its requirements only (so
pydantic, mcp and everything else of the server's environment stay invisible there, as in a
user's project venv). `packages` are written straight into the venv's site-packages, which is
what `pip install --no-deps` of a local folder leaves there.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path


def _requirement_closure(dist_name: str) -> set[str]:
    seen: set[str] = set()
    todo = [dist_name]
    while todo:
        name = re.split(r"[\s;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if not name or name in seen:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for req in dist.requires or []:
            if "extra ==" not in req:
                todo.append(req)
    return seen


def torch_only_folder(folder: Path) -> Path:
    """A folder of links to the top-level modules of torch and its requirement closure."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in _requirement_closure("torch"):
        dist = importlib.metadata.distribution(name)
        tops = set()
        for file in dist.files or []:
            first = file.parts[0]
            if first.endswith((".dist-info", ".data")) or first == "..":
                continue
            if first.endswith(".libs"):
                tops.add(first)
                continue
            tops.add(first if len(file.parts) > 1 else file.name)
        for top in tops:
            source = Path(str(dist.locate_file(top)))
            target = folder / top
            if source.exists() and not target.exists() and not top.endswith(".pth"):
                target.symlink_to(source, target_is_directory=source.is_dir())
    return folder


def site_packages(env: Path) -> Path:
    v = sys.version_info
    return env / "lib" / f"python{v.major}.{v.minor}" / "site-packages"


def make_env(
    env: Path,
    *,
    with_torch: bool = True,
    packages: dict[str, str] | None = None,
    pth: list[Path] | None = None,
) -> Path:
    """Create a venv at `env`; return its bin/python."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    site = site_packages(env)
    lines = [str(p) for p in pth or []]
    if with_torch:
        lines.append(str(torch_only_folder(env.parent / f"{env.name}-torch-links")))
    (site / "zz_test_paths.pth").write_text("".join(line + "\n" for line in lines))
    for name, source in (packages or {}).items():
        (site / f"{name}.py").write_text(source)
    return env / "bin" / "python"

"""The installed product: build the sdist and wheel, install the wheel, run it from elsewhere.

Run: `python -m pytest tests/test_packaging.py` (the demo run is `-m slow`).

The build copies the repository to a temporary folder and runs `python -m build --no-isolation`
there (sdist first, then the wheel from the sdist, so a file missing from the sdist is missing
from the wheel too). The wheel is installed with `pip install --no-deps --target` (the test's
environment already holds torch, mcp and the rest) and run from an unrelated project folder that
has its own `tools/`, `skills/` and `examples/` packages, each of which raises when imported: the
installed product must not import any of them, nor anything from this clone.

Known limitations: the wheel is installed next to the test environment's dependencies, not into a
fresh virtual environment with its own resolution (that is `.ci/run`'s job, and
tests/test_run_without_clone.py's for uvx and pipx).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.repo_copy import copy_repository

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "torch_skills"
TRAP = "raise ImportError('the installed torch-skills imported the project folder {name}/')\n"


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _repo_files(folder: str) -> set[str]:
    """Files under a top-level folder of the clone, relative to it (no caches)."""
    root = REPO / folder
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc" and not p.name.startswith(".")
    }


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel, built from a copy of this repository."""
    try:
        import build  # noqa: F401
        import setuptools  # noqa: F401
    except ModuleNotFoundError as e:
        pytest.fail(f"{e.name} is missing: `pip install -e '.[dev]'` installs it (needed to build offline)")
    src = copy_repository(tmp_path_factory.mktemp("src"))
    out = src.parent / "dist"
    run = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


@pytest.fixture(scope="module")
def installed(dists, tmp_path_factory) -> Path:
    """The wheel installed into a temporary --target folder (no dependencies: the venv has them)."""
    target = tmp_path_factory.mktemp("site")
    run = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(target),
         str(dists["wheel"])],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return target


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """An unrelated user project whose own tools/, skills/ and examples/ packages blow up on import."""
    root = tmp_path_factory.mktemp("user-project")
    for name in ("tools", "skills", "examples"):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(TRAP.format(name=name))
    (root / "server.py").write_text("raise ImportError('the installed torch-skills imported server.py')\n")
    return root


def _env(target: Path) -> dict[str, str]:
    """The environment of a user shell: only the install target added, never this clone."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = str(target)
    return env


def _run(args: list[str], target: Path, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=_env(target), capture_output=True, text=True, timeout=timeout)


def test_the_packages_in_pyproject_are_exactly_the_code_folders():
    """Every folder under tools/ with an __init__.py is listed as a torch_skills package, and nothing else."""
    setuptools_cfg = _pyproject()["tool"]["setuptools"]
    assert setuptools_cfg["package-dir"] == {
        "": "tools",
        f"{PACKAGE}.skills": "skills",
        f"{PACKAGE}.examples": "examples",
    }
    on_disk = {
        ".".join(init.parent.relative_to(REPO / "tools").parts)
        for init in (REPO / "tools").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    listed = set(setuptools_cfg["packages"])
    assert listed - {f"{PACKAGE}.skills", f"{PACKAGE}.examples"} == on_disk
    assert (REPO / "examples" / "__init__.py").is_file()


def test_the_console_script_points_at_the_package_cli():
    """`torch-skills` is the package's cli.main, the module `python -m torch_skills` runs too."""
    assert _pyproject()["project"]["scripts"] == {"torch-skills": f"{PACKAGE}.cli:main"}
    assert (REPO / "tools" / PACKAGE / "__main__.py").read_text().count(
        f"from {PACKAGE}.cli import main"
    ) == 1


def test_the_wheel_holds_one_package_with_every_skill_and_example(dists):
    """The wheel installs `torch_skills` only, with every file of skills/, the demo's examples and the
    post model `route` reads."""
    names = zipfile.ZipFile(dists["wheel"]).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {PACKAGE}
    assert not any(n.startswith(("tools/", "skills/", "examples/", "server.py")) for n in names)
    in_wheel = set(names)
    skill_files = _repo_files("skills")
    assert {f for f in skill_files if f.endswith("/SKILL.md")}, "no SKILL.md found in the clone"
    missing = {f for f in skill_files if f"{PACKAGE}/skills/{f}" not in in_wheel}
    assert not missing, f"skill files left out of the wheel: {sorted(missing)}"
    # .json.gz: route's two post models
    code = {f for f in _repo_files("tools") if f.endswith((".py", ".json.gz"))}
    assert code and all(f.startswith(f"{PACKAGE}/") for f in code)
    assert {f"{PACKAGE}/skillpack/post_model.json.gz", f"{PACKAGE}/skillpack/gate_model.json.gz"} <= code
    assert {f for f in code if f not in in_wheel} == set()
    assert {f"{PACKAGE}/examples/tiny_lm.py", f"{PACKAGE}/examples/demo.py"} <= in_wheel
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert f"torch-skills = {PACKAGE}.cli:main" in zipfile.ZipFile(dists["wheel"]).read(entry_points).decode()


def test_the_sdist_keeps_the_repository_layout(dists):
    """The sdist holds the clone's top level (tools/, skills/, examples/, pyproject, README) to rebuild from."""
    with tarfile.open(dists["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "tools/torch_skills/cli.py", "examples/tiny_lm.py"} <= names
    assert {f"skills/{f}" for f in _repo_files("skills")} <= names


def test_the_installed_package_is_imported_from_the_install_not_the_clone(installed, project):
    """From a project with its own tools/ package, `import torch_skills` resolves to the installed copy."""
    run = _run(
        [sys.executable, "-c", "import torch_skills, sys; print(torch_skills.__file__)"], installed, project
    )
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.strip()).resolve().is_relative_to(installed.resolve())


def test_python_m_torch_skills_check_passes_from_another_directory(installed, project):
    """`python -m torch_skills --check` validates the installed skills from an unrelated project folder."""
    run = _run([sys.executable, "-m", PACKAGE, "--check"], installed, project)
    assert run.returncode == 0, run.stderr
    assert "OK" in run.stdout


def test_the_console_script_answers_version_and_check(installed, project):
    """The installed `torch-skills` script prints the version and passes --check outside the clone."""
    script = installed / "bin" / "torch-skills"
    assert script.is_file(), f"pip wrote no console script: {sorted(p.name for p in installed.iterdir())}"
    version = _run([str(script), "--version"], installed, project)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"torch-skills {_pyproject()['project']['version']}"
    check = _run([str(script), "--check"], installed, project)
    assert check.returncode == 0, check.stderr


async def test_the_console_script_serves_the_installed_skills_over_stdio(installed, project):
    """Launched by a client from the user's project, the installed script lists tools and serves skills."""
    params = StdioServerParameters(
        command=str(installed / "bin" / "torch-skills"),
        args=["--no-prewarm"],
        cwd=str(project),
        env=_env(installed),
    )
    async with Client(params) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert {"route", "check_gradients", "estimate_memory", "profile_model", "verify_checkpoint"} <= names
        skills = (await c.call_tool("list_skills", {})).structured_content["skills"]
        assert {s["name"] for s in skills} == {p.parent.name for p in (REPO / "skills").glob("*/SKILL.md")}


@pytest.mark.slow
def test_the_installed_demo_runs_every_tool_from_another_directory(installed, project):
    """`torch-skills --demo` from the wheel runs every tool on the bundled example, away from the clone."""
    run = _run([str(installed / "bin" / "torch-skills"), "--demo"], installed, project, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for tool in ("route", "check_gradients", "profile_model", "estimate_memory", "verify_checkpoint"):
        assert f"== {tool}" in run.stdout
    assert "Traceback" not in run.stdout + run.stderr

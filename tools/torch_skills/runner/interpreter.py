"""Which Python interpreter runs the user's code, and what the worker needs on its path there.

Use it when building the server:

    interp = find_interpreter(explicit=args.python, cwd=Path.cwd())
    pool = WorkerPool(python=str(interp.executable), python_source=interp.source)

The order is: `--python PATH` (an interpreter, or an environment folder holding bin/python),
then `VIRTUAL_ENV`, then a `.venv`, `venv`, `.conda` or `env` environment folder in the server's
working directory, then `CONDA_PREFIX`, then the server's own interpreter. An environment that
*is* the server's own is not a finding: it falls through to the next rule, so the answer says
where the user's code really comes from.

Detection only reads the file system (a pyvenv.cfg or conda-meta beside an executable bin/python);
it never runs a candidate. It looks only in the working directory the user started the server in,
never in `--allow` folders or client roots, which may be downloaded model folders carrying an
interpreter of their own. An interpreter found in a folder (`Interpreter.found_in_folder`) is not
started before a call that names project code (the server does not prewarm it); the path reported
as `run.python` is the one chosen here, as found on disk, never a resolved link.

The worker imports nothing of the server's environment but pydantic and its pure dependencies
(its result models; see `WORKER_DEPENDENCIES`). When the worker runs under another interpreter,
`worker_dependency_dir` builds a folder holding links to exactly those packages, and the
worker *appends* it to `sys.path` (`runner.zygote`): a copy the user's environment has always wins, and nothing
else of the server's environment (its torch above all) becomes importable there.

Known limitations: the interpreter is chosen once, at start-up, so an MCP client root offered
later in a call is not searched for an environment (start the server in the project, or pass
--python). pydantic_core is a compiled extension, so the server's copy only serves an
interpreter of the same Python version and platform; under another version the worker needs
pydantic>=2 installed in the user's environment (the start-up error says so, with the command).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Top-level modules the worker side imports outside the standard library and torch's own
# dependencies (tests/test_interpreter.py imports every worker module in a venv that has only these and torch).
WORKER_DEPENDENCIES = (
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "typing_inspection",
    "typing_extensions",
)

# Environment folders looked for in a project directory, in this order.
ENV_FOLDERS = (".venv", "venv", ".conda", "env")

# Environment variable the worker reads at start: folders to append to its sys.path.
WORKER_PATH_ENV = "TORCH_SKILLS_WORKER_PATH"


class InterpreterError(ValueError):
    """`--python` names something that is not a runnable Python interpreter."""


@dataclass(frozen=True)
class Interpreter:
    """The interpreter the worker runs under, and why it was chosen."""

    executable: Path
    source: str  # e.g. "--python", "VIRTUAL_ENV", ".venv in /home/me/proj", "the server's own"
    found_in_folder: bool = False  # found by looking in the working directory, not named by the user

    @property
    def is_server(self) -> bool:
        return same_environment(self.executable, sys.executable)

    def describe(self) -> str:
        return f"{self.executable} ({self.source})"


def same_environment(a: str | Path, b: str | Path) -> bool:
    """Whether two interpreter paths belong to one environment (the same bin folder).

    Links are not resolved: a venv's python is usually a link to the base interpreter, yet the
    venv is another environment (its pyvenv.cfg sits beside the link)."""
    return os.path.abspath(os.path.dirname(a)) == os.path.abspath(os.path.dirname(b))


def env_python(env_dir: Path) -> Path | None:
    """The python executable of a venv or conda environment folder, or None when it has none."""
    for candidate in (
        env_dir / "bin" / "python",
        env_dir / "bin" / "python3",
        env_dir / "Scripts" / "python.exe",
    ):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _is_environment(env_dir: Path) -> bool:
    return (env_dir / "pyvenv.cfg").is_file() or (env_dir / "conda-meta").is_dir()


def _server_prefixes() -> set[Path]:
    return {Path(os.path.realpath(p)) for p in (sys.prefix, sys.exec_prefix)}


def _is_server_env(env_dir: Path) -> bool:
    return Path(os.path.realpath(env_dir)) in _server_prefixes()


def _explicit(path: str) -> Interpreter:
    given = Path(path).expanduser()
    if given.is_dir():
        python = env_python(given)
        if python is None:
            raise InterpreterError(
                f"--python {path}: the folder holds no bin/python; give the interpreter itself "
                "(e.g. .venv/bin/python) or an environment folder"
            )
        return Interpreter(python.absolute(), "--python")
    if not given.exists():
        found = shutil.which(path)
        if found is None:
            raise InterpreterError(f"--python {path}: no such file; give the path of a Python interpreter")
        given = Path(found)
    if not os.access(given, os.X_OK):
        raise InterpreterError(
            f"--python {path}: the file is not executable; give the path of a Python interpreter"
        )
    return Interpreter(given.absolute(), "--python")


def project_environment(directory: Path) -> Path | None:
    """The first environment folder (.venv, venv, .conda, env) directly inside `directory`."""
    for name in ENV_FOLDERS:
        env_dir = directory / name
        if env_dir.is_dir() and _is_environment(env_dir) and env_python(env_dir) is not None:
            return env_dir
    return None


def find_interpreter(
    explicit: str | None = None,
    *,
    cwd: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Interpreter:
    """The interpreter for the worker, by the order in the module docstring.

    Raises InterpreterError when `explicit` is not an interpreter; discovery itself never fails
    (the server's own interpreter is the last answer)."""
    if explicit:
        return _explicit(explicit)
    environ = os.environ if environ is None else environ
    active = environ.get("VIRTUAL_ENV")
    if active:
        env_dir = Path(active)
        python = env_python(env_dir)
        if python is not None and not _is_server_env(env_dir):
            return Interpreter(python.absolute(), f"VIRTUAL_ENV={active}")
    for directory in [cwd] if cwd is not None else []:
        env_dir = project_environment(Path(directory))
        if env_dir is not None and not _is_server_env(env_dir):
            python = env_python(env_dir)
            assert python is not None
            return Interpreter(
                python.absolute(), f"{env_dir.name} in {Path(directory).absolute()}", found_in_folder=True
            )
    conda = environ.get("CONDA_PREFIX")
    if conda:
        env_dir = Path(conda)
        python = env_python(env_dir)
        if python is not None and not _is_server_env(env_dir):
            return Interpreter(python.absolute(), f"CONDA_PREFIX={conda}")
    return Interpreter(Path(sys.executable), "the server's own")


def worker_package_dir(parent: Path | None = None) -> Path:
    """A new folder holding one link, `torch_skills`, to the package this server runs from.

    Put on the worker's PYTHONPATH, it makes `python -m torch_skills.runner.zygote` import this
    server's code under any interpreter, and exposes no other module name to the user's imports.
    The caller removes it when the worker is gone."""
    folder = Path(tempfile.mkdtemp(prefix="torch-skills-worker-pkg-", dir=parent))
    (folder / "torch_skills").symlink_to(Path(__file__).resolve().parents[1], target_is_directory=True)
    return folder


def worker_dependency_dir(parent: Path | None = None) -> Path:
    """A new folder holding links to the server's copies of WORKER_DEPENDENCIES (and nothing else).

    The caller removes it when the worker is gone. A dependency the server lacks is skipped
    (the worker then reports the missing import with its install command)."""
    folder = Path(tempfile.mkdtemp(prefix="torch-skills-worker-deps-", dir=parent))
    for name in WORKER_DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None and not spec.submodule_search_locations:
            continue
        if spec.submodule_search_locations:  # a package: link its folder
            source = Path(next(iter(spec.submodule_search_locations)))
            (folder / name).symlink_to(source, target_is_directory=True)
        else:  # a single-file module such as typing_extensions.py
            source = Path(str(spec.origin))
            (folder / source.name).symlink_to(source)
    return folder

"""The worker runs under the project's interpreter: --python, auto-detection, and clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client

from tests.owned import entered_in_own_task
from tests.project_envs import make_env, torch_only_folder
from torch_skills.runner.interpreter import (
    WORKER_DEPENDENCIES,
    WORKER_PATH_ENV,
    InterpreterError,
    find_interpreter,
    worker_dependency_dir,
    worker_package_dir,
)
from torch_skills.server import build_server

# A src/-layout project: its package imports a module that only the project's venv has.
PROJECT_MODEL = """\
import torch
import only_in_project_venv


def build():
    width = only_in_project_venv.WIDTH
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))
"""


def _fake_env(folder: Path, kind: str = "venv") -> Path:
    (folder / "bin").mkdir(parents=True)
    python = folder / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    if kind == "venv":
        (folder / "pyvenv.cfg").write_text("home = /usr/bin\n")
    else:
        (folder / "conda-meta").mkdir()
    return python


def test_an_explicit_python_wins_over_everything(tmp_path: Path):
    """--python is taken as given, and an environment folder means its bin/python."""
    python = _fake_env(tmp_path / "chosen")
    _fake_env(tmp_path / "proj" / ".venv")
    env = {"VIRTUAL_ENV": str(tmp_path / "proj" / ".venv")}
    assert find_interpreter(str(python), cwd=tmp_path / "proj", environ=env).executable == python
    assert find_interpreter(str(tmp_path / "chosen"), environ={}).executable == python


def test_a_python_that_does_not_exist_is_an_error_with_the_next_step(tmp_path: Path):
    """A wrong --python fails at start-up and says what to give instead."""
    with pytest.raises(InterpreterError, match="no such file"):
        find_interpreter(str(tmp_path / "nope" / "python"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InterpreterError, match="holds no bin/python"):
        find_interpreter(str(tmp_path / "empty"))


def test_discovery_order_is_virtual_env_then_the_working_directory_then_conda(tmp_path: Path):
    """VIRTUAL_ENV, then .venv/venv in the server's working directory, then CONDA_PREFIX, then the server's."""
    active = _fake_env(tmp_path / "active")
    proj_venv = _fake_env(tmp_path / "proj" / "venv")
    conda = _fake_env(tmp_path / "conda", kind="conda")
    cwd = tmp_path / "proj"
    both = {"VIRTUAL_ENV": str(tmp_path / "active"), "CONDA_PREFIX": str(tmp_path / "conda")}
    assert find_interpreter(cwd=cwd, environ=both).executable == active
    found = find_interpreter(cwd=cwd, environ={"CONDA_PREFIX": str(tmp_path / "conda")})
    assert found.executable == proj_venv and found.source.startswith("venv in ") and found.found_in_folder
    assert find_interpreter(environ={"CONDA_PREFIX": str(tmp_path / "conda")}).executable == conda
    assert not find_interpreter(environ={"CONDA_PREFIX": str(tmp_path / "conda")}).found_in_folder
    assert find_interpreter(environ={}).is_server


def test_the_servers_own_environment_is_not_taken_for_the_users(tmp_path: Path):
    """VIRTUAL_ENV naming the server's own venv falls through to the project's .venv."""
    proj_venv = _fake_env(tmp_path / ".venv")
    env = {"VIRTUAL_ENV": sys.prefix}
    assert find_interpreter(cwd=tmp_path, environ=env).executable == proj_venv


def test_a_folder_without_an_environment_marker_is_not_an_environment(tmp_path: Path):
    """An `env/` folder that merely holds a bin/python (no pyvenv.cfg or conda-meta) is ignored."""
    (tmp_path / "env" / "bin").mkdir(parents=True)
    (tmp_path / "env" / "bin" / "python").write_text("")
    (tmp_path / "env" / "bin" / "python").chmod(0o755)
    assert find_interpreter(cwd=tmp_path, environ={}).is_server


def test_the_dependency_folder_holds_exactly_the_workers_dependencies(tmp_path: Path):
    """Links to pydantic and its pure dependencies only: never torch or anything else of the server's."""
    folder = worker_dependency_dir(tmp_path)
    names = {p.name.removesuffix(".py") for p in folder.iterdir()}
    assert names == set(WORKER_DEPENDENCIES)
    assert all(p.is_symlink() for p in folder.iterdir())


# --------------------------------------------------------------------------------------------
# Real second environments (made with `python -m venv` in a temp dir; torch linked in, no pydantic)
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def src_project(tmp_path_factory) -> Path:
    """A src/-layout project with its own .venv: the project installed editable, plus a package only it has."""
    root = tmp_path_factory.mktemp("project")
    package = root / "src" / "projnet"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(PROJECT_MODEL)
    make_env(
        root / ".venv",
        packages={"only_in_project_venv": "WIDTH = 12\n"},
        pth=[root / "src"],  # what `pip install -e .` of a src/ layout leaves in site-packages
    )
    return root


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
def test_the_project_venv_lacks_pydantic_and_the_server_lacks_the_projects_package(src_project: Path):
    """The setting is real: each environment has something the other lacks."""
    python = src_project / ".venv" / "bin" / "python"
    assert subprocess.run([python, "-c", "import pydantic"], capture_output=True).returncode != 0
    assert subprocess.run([python, "-c", "import projnet.model"], capture_output=True).returncode == 0
    assert (
        subprocess.run([sys.executable, "-c", "import only_in_project_venv"], capture_output=True).returncode
        != 0
    )


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
def test_the_worker_imports_only_the_listed_dependencies_in_a_bare_environment(src_project: Path):
    """Every preloaded worker module imports under the project's interpreter with the dependency folder appended."""
    python = src_project / ".venv" / "bin" / "python"
    deps = worker_dependency_dir(src_project)
    code = (
        "import sys, importlib\n"
        f"sys.path.insert(0, {str(worker_package_dir(src_project))!r})\n"
        f"sys.path.append({str(deps)!r})\n"
        "for m in ['torch_skills.runner.zygote', 'torch_skills.runner.usercode', 'torch_skills.gradients.worker',\n"
        "          'torch_skills.checkpoint.worker', 'torch_skills.memory.worker', 'torch_skills.profiling.worker']:\n"
        "    importlib.import_module(m)\n"
        "import pydantic; print(pydantic.__file__)\n"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().startswith(str(deps))


async def _check_gradients(client: Client, model: str):
    return await client.call_tool(
        "check_gradients", {"model": model, "input_shape": [4, 12], "device": "cpu"}
    )


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_a_src_layout_project_runs_under_its_venv_given_with_python(src_project: Path, monkeypatch):
    """--python runs the model from the project's own venv: its package and its dependency import."""
    monkeypatch.chdir(src_project)
    python = str(src_project / ".venv" / "bin" / "python")
    async with entered_in_own_task(lambda: Client(build_server(python=python, prewarm=False))) as client:
        r = await _check_gradients(client, "projnet.model:build")
    assert not r.is_error, r.content
    assert r.structured_content["run"]["python"] == python
    assert len(r.structured_content["parameters"]) == 4


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_a_project_dot_venv_is_found_without_any_flag(src_project: Path, monkeypatch):
    """Started in the project folder, the server finds .venv by itself."""
    monkeypatch.chdir(src_project)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    async with entered_in_own_task(lambda: Client(build_server(prewarm=False))) as client:
        r = await _check_gradients(client, "projnet.model:build")
    assert not r.is_error, r.content
    assert r.structured_content["run"]["python"] == str(src_project / ".venv" / "bin" / "python")


async def test_an_environment_without_torch_is_an_error_naming_the_interpreter_and_the_install(
    tmp_path: Path, monkeypatch
):
    """No torch in the chosen interpreter: the tool error names it and the pip command to run there."""
    python = make_env(tmp_path / "notorch", with_torch=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.py").write_text("def build():\n    return None\n")
    async with entered_in_own_task(lambda: Client(build_server(python=str(python), prewarm=False))) as client:
        r = await _check_gradients(client, "m.py:build")
    assert r.is_error
    text = r.content[0].text
    assert str(python) in text and "cannot import torch" in text
    assert f"{python} -m pip install torch" in text and "--python" in text


def test_an_old_torch_is_named_with_the_version_it_needs(tmp_path: Path):
    """A torch below the minimum: the worker refuses to start and says which version and how to upgrade."""
    fake = tmp_path / "fake-old-torch"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("__version__ = '1.13.1'\n")
    python = make_env(tmp_path / "old", with_torch=False, pth=[fake])
    env = dict(
        os.environ,
        PYTHONPATH=str(worker_package_dir(tmp_path)),
        **{WORKER_PATH_ENV: str(worker_dependency_dir(tmp_path))},
    )
    done = subprocess.run(
        [python, "-m", "torch_skills.runner.zygote"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert '"event":"unusable"' in done.stdout
    assert "has torch 1.13.1" in done.stdout and "torch>=2.4" in done.stdout


def test_the_torch_links_folder_holds_torch_but_not_pydantic(tmp_path: Path):
    """The test helper itself: the second environment gets torch and nothing of the server's tooling."""
    folder = torch_only_folder(tmp_path / "links")
    names = {p.name for p in folder.iterdir()}
    assert "torch" in names and "pydantic" not in names and "mcp" not in names


async def test_with_no_torch_anywhere_a_torch_tool_names_the_one_fix(tmp_path: Path, monkeypatch):
    """The server's own environment without torch (as `uvx torch-skills` makes it): --python comes first, then the extra."""
    python = make_env(tmp_path / "server-env", with_torch=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("torch_skills.runner.interpreter.same_environment", lambda a, b: True)
    (tmp_path / "m.py").write_text("def build():\n    return None\n")
    async with entered_in_own_task(lambda: Client(build_server(python=str(python), prewarm=False))) as client:
        r = await _check_gradients(client, "m.py:build")
    assert r.is_error
    text = r.content[0].text
    assert "--python /path/to/your/project/.venv/bin/python" in text
    assert "torch-skills[torch]" in text and str(tmp_path) in text

"""Running without a clone: `uvx --from <path> torch-skills` and `pipx run --spec <path> torch-skills`.

Run: `python -m pytest tests/test_run_without_clone.py` (needs `uv`/`pipx` on PATH or in this
venv, and a package index; the torch-carrying runs are `-m slow`).

Each test builds a copy of this repository through the tool itself (the local path form of the
README's commands) and runs it from an unrelated project folder. torch is the one dependency a
test cannot fetch freely (the default Linux wheel pulls GBs of CUDA libraries), and the server
does not depend on it, so:
- the uvx tests resolve the server's own dependencies only (no torch: that is checked);
- the demo and pipx tests add torch from a local wheel (`find-links` in pip's configuration or
  `PIP_FIND_LINKS`), pinned, and are skipped, saying so, where no such wheel exists.

Known limitations: the `git+https://...` form needs the public repository and is not run here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.repo_copy import REPO, copy_repository

PLUGIN_ROOT_VAR = "${CLAUDE_PLUGIN_ROOT}"


def _tool(name: str) -> str | None:
    """`name` from this interpreter's bin folder or PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.is_file() else shutil.which(name)


def _local_torch_wheel() -> tuple[Path, str] | None:
    """(folder, version) of a torch wheel on this machine that pip is configured to find, if any."""
    folders = os.environ.get("PIP_FIND_LINKS", "").split()
    config = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links"):
            folders += value.strip("'\"").split()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for folder in folders:
        path = Path(folder.removeprefix("file://"))
        for wheel in sorted(path.glob(f"torch-*-{tag}-{tag}-*.whl")) if path.is_dir() else ():
            return path, wheel.name.split("-")[1]
    return None


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of this repository: what a user's `--from <path>` / `--spec <path>` points at."""
    return copy_repository(tmp_path_factory.mktemp("checkout"))


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """An unrelated user project (with its own tools/ package) to run from."""
    root = tmp_path_factory.mktemp("user-project")
    (root / "tools").mkdir()
    (root / "tools" / "__init__.py").write_text(
        "raise ImportError('torch-skills imported the project tools/')\n"
    )
    return root


@pytest.fixture(scope="module")
def uv_env(tmp_path_factory) -> dict[str, str]:
    """Environment for uvx: this venv's interpreter, nothing of the clone on the path."""
    if _tool("uvx") is None:
        pytest.skip("uv is not installed here (`pip install uv`)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(UV_PYTHON=sys.executable, PATH=_path_with_tools())
    return env


def _path_with_tools() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


@pytest.mark.slow  # resolves the dependencies from the package index: network, and tens of seconds
def test_uvx_from_a_local_path_passes_check(source, project, uv_env):
    """`uvx --from <path> torch-skills --check` builds the path, installs the console script and validates the skills."""
    run = subprocess.run(
        ["uvx", "--from", str(source), "torch-skills", "--check"],
        cwd=project, env=uv_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "OK" in run.stdout.splitlines()[-1]
    no_torch = subprocess.run(
        ["uvx", "--from", str(source), "python", "-c", "import importlib.util as u; print(u.find_spec('torch'))"],
        cwd=project, env=uv_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert no_torch.returncode == 0, no_torch.stderr[-3000:]
    assert no_torch.stdout.strip() == "None", "the server's install pulled torch"


@pytest.mark.slow  # the same resolution through uvx
async def test_the_plugin_server_command_serves_over_stdio(source, project, uv_env):
    """plugin.json's exact MCP command, with ${CLAUDE_PLUGIN_ROOT} set to a checkout, answers tools/list."""
    server = json.loads((REPO / ".claude-plugin" / "plugin.json").read_text())["mcpServers"]["torch-skills"]
    args = [a.replace(PLUGIN_ROOT_VAR, str(source)) for a in server["args"]]
    params = StdioServerParameters(
        command=server["command"], args=[*args, "--no-prewarm"], cwd=str(project), env=uv_env
    )
    async with Client(params) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert {"route", "check_gradients", "estimate_memory", "profile_model", "verify_checkpoint"} <= names
        routed = await c.call_tool("route", {"query": "CUDA out of memory at step 1"})
        assert not routed.is_error


@pytest.mark.slow
def test_uvx_from_a_local_path_runs_the_demo_with_torch(source, project, uv_env, tmp_path):
    """With torch resolved (from a local wheel), `uvx --from <path> torch-skills --demo` runs every tool."""
    found = _local_torch_wheel()
    if found is None:
        pytest.skip("no local torch wheel in pip's find-links: uvx would download torch from the index")
    folder, version = found
    env = {**uv_env, "UV_FIND_LINKS": str(folder)}
    run = subprocess.run(
        ["uvx", "--with", f"torch=={version}", "--from", str(source), "torch-skills", "--demo"],
        cwd=project, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for tool in ("check_gradients", "profile_model", "estimate_memory", "verify_checkpoint"):
        assert f"== {tool}" in run.stdout


@pytest.mark.slow
def test_pipx_run_from_a_local_path_passes_check(source, project, tmp_path):
    """`pipx run --spec <path> torch-skills --check` installs the path with its dependencies and validates the skills."""
    if _tool("pipx") is None:
        pytest.skip("pipx is not installed here (`pip install pipx`)")
    found = _local_torch_wheel()
    if found is None:
        pytest.skip("no local torch wheel in pip's find-links: pipx would download torch from the index")
    folder, version = found
    pin = tmp_path / "pin-torch.txt"
    pin.write_text(f"torch=={version}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        PIPX_HOME=str(tmp_path / "pipx"), PIPX_BIN_DIR=str(tmp_path / "bin"), PIP_FIND_LINKS=str(folder),
        PIP_CONSTRAINT=str(pin), PATH=_path_with_tools(),
    )  # fmt: skip
    run = subprocess.run(
        ["pipx", "run", "--backend", "pip", "--python", sys.executable, "--spec", str(source), "torch-skills", "--check"],
        cwd=project, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "OK" in run.stdout.splitlines()[-1]

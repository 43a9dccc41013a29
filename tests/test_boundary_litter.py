"""Abuse matrix, litter: no file is overwritten, no bytecode lands in the project, no job folder leaks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from tests.owned import entered_in_own_task
from torch_skills.runner.pool import JOB_DIR_PREFIX, sweep_stale_job_dirs
from torch_skills.server import build_server


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("littered")
    pkg = root / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "layers.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(4, 2)\n")
    (pkg / "models.py").write_text("from .layers import make\n\ndef build():\n    return make()\n")
    (root / "helpers.py").write_text("import torch\n\ndef width():\n    return 4\n")
    (root / "model.py").write_text(
        "import torch\nfrom helpers import width\n\ndef build():\n    return torch.nn.Linear(width(), 2)\n"
    )
    return root


@pytest.fixture(scope="module")
async def client(project: Path) -> AsyncIterator[Client]:
    """The server, started without PYTHONDONTWRITEBYTECODE in its environment (as users run it)."""
    saved = os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        async with entered_in_own_task(lambda: Client(build_server(allow=[project]))) as c:
            yield c
    finally:
        if saved is not None:
            os.environ["PYTHONDONTWRITEBYTECODE"] = saved


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_an_existing_trace_path_is_refused_and_left_untouched(client: Client, project: Path):
    """profile_model never replaces a file: it says to pick another name, and the file keeps its bytes."""
    trace = project / "step.json"
    trace.write_text("my notes, not a trace")
    result = await client.call_tool(
        "profile_model",
        {
            "model": f"{project / 'model.py'}:build",
            "input_shape": [2, 4],
            "trace_path": str(trace),
            "warmup_steps": 1,
            "active_steps": 3,
        },
    )
    assert (
        result.is_error
        and "already exists" in result.content[0].text
        and "another name" in result.content[0].text
    )
    assert trace.read_text() == "my notes, not a trace"


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_a_new_trace_path_is_written(client: Client, project: Path):
    """The refusal is about existing files only: a fresh name gets its trace."""
    trace = project / "traces" / "fresh.json"
    result = await client.call_tool(
        "profile_model",
        {
            "model": f"{project / 'model.py'}:build",
            "input_shape": [2, 4],
            "trace_path": str(trace),
            "warmup_steps": 1,
            "active_steps": 3,
        },
    )
    assert not result.is_error, result.content[0].text
    assert trace.stat().st_size > 0 and not list(trace.parent.glob(".*tmp"))


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
@pytest.mark.parametrize("tool", ["check_gradients", "estimate_memory", "profile_model"])
async def test_no_bytecode_is_written_into_the_users_project(client: Client, project: Path, tool: str):
    """Importing the user's files (a package and a lone file with a sibling) leaves no __pycache__."""
    for model in (f"{project / 'pkg/models.py'}:build", f"{project / 'model.py'}:build"):
        args = {"model": model, "input_shape": [2, 4]}
        if tool == "profile_model":
            args |= {"warmup_steps": 1, "active_steps": 3}
        result = await client.call_tool(tool, args)
        assert not result.is_error, result.content[0].text
    assert not list(project.rglob("__pycache__")) and not list(project.rglob("*.pyc"))


def test_stale_job_folders_of_dead_servers_are_swept_and_live_ones_kept(tmp_path: Path):
    """Only folders whose owning process is gone are removed; a live server's folder stays."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{JOB_DIR_PREFIX}{dead.pid}-abc"
    live = tmp_path / f"{JOB_DIR_PREFIX}{os.getpid()}-def"
    foreign = tmp_path / f"{JOB_DIR_PREFIX}notapid"
    for folder in (stale, live, foreign):
        folder.mkdir()
        (folder / "request.json").write_text("{}")
    removed = sweep_stale_job_dirs(tmp_path)
    assert removed == [stale] and not stale.exists() and live.exists() and foreign.exists()

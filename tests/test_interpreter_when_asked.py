"""The project's interpreter runs only for a call that names project code, and is looked for only in the working directory.

A sentinel interpreter (`.venv/bin/python`, a link to a script that leaves a file and then runs
the test's Python) shows when it is executed: never by detection, the prewarm, route, the skill
tools, resources or prompts; never for verify_checkpoint without `model` (the server's own Python
runs that, or, without torch there, the answer says what was skipped); only for `model=...`, and
`run.python` then names the link as found on disk.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from mcp import Client

from tests.owned import entered_in_own_task
from torch_skills import server as server_module
from torch_skills.runner.interpreter import find_interpreter
from torch_skills.server import build_server


def _sentinel_env(folder: Path, marker: Path) -> Path:
    """`folder/.venv`, whose bin/python links to a script that touches `marker` and runs the real Python."""
    real = folder / "elsewhere" / "python-wrapper"
    real.parent.mkdir(parents=True)
    real.write_text(f'#!/bin/sh\ntouch "{marker}"\nexec "{sys.executable}" "$@"\n')
    real.chmod(0o755)
    (folder / ".venv" / "bin").mkdir(parents=True)
    (folder / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    link = folder / ".venv" / "bin" / "python"
    link.symlink_to(real)
    return link


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    """(project folder as the working directory, its sentinel .venv/bin/python, the marker)."""
    root = tmp_path / "proj"
    root.mkdir()
    marker = tmp_path / "interpreter-ran"
    link = _sentinel_env(root, marker)
    (root / "m.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(4, 2)\n")
    monkeypatch.chdir(root)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    return root, link, marker


def _checkpoint(folder: Path) -> Path:
    """A small safetensors file written by hand (no torch in this process needed)."""
    import json
    import struct

    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path = folder / "w.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    return path


def test_detection_reads_files_only_and_never_looks_in_allow_folders(tmp_path: Path, project):
    """Finding .venv runs nothing; a downloaded folder's interpreter is never a candidate."""
    root, link, marker = project
    found = find_interpreter(cwd=root, environ={})
    assert found.executable == link and found.found_in_folder and not marker.exists()
    downloaded = tmp_path / "downloaded"
    downloaded.mkdir()
    _sentinel_env(downloaded, tmp_path / "downloaded-ran")
    elsewhere = tmp_path / "plain"
    elsewhere.mkdir()
    assert find_interpreter(cwd=elsewhere, environ={}).is_server  # the --allow folder is not searched


async def test_route_skills_resources_and_prompts_never_start_the_detected_interpreter(project):
    """Even with prewarm on, nothing runs the project's .venv until a call names project code."""
    _, _, marker = project
    async with entered_in_own_task(lambda: Client(build_server(prewarm=True))) as client:
        await client.call_tool("route", {"query": "my loss is NaN after a few steps"})
        await client.call_tool("list_skills", {})
        await client.call_tool("get_skill", {"name": "debugging-techniques"})
        resources = await client.list_resources()
        await client.read_resource(resources.resources[0].uri)
        prompts = await client.list_prompts()
        await client.get_prompt(prompts.prompts[0].name, {"problem": "NaN loss"})
        await asyncio.sleep(0.5)  # a prewarm would have started by now
    assert not marker.exists()


async def test_a_files_only_call_without_torch_in_the_server_answers_from_the_static_scan(
    project, monkeypatch
):
    """verify_checkpoint without model, no torch in the server's environment: the static verdict, the skipped checks named."""
    root, _, marker = project
    monkeypatch.setattr(server_module, "server_has_torch", lambda: False)
    path = _checkpoint(root)
    async with entered_in_own_task(lambda: Client(build_server(prewarm=False))) as client:
        result = await client.call_tool("verify_checkpoint", {"path": str(path)})
    assert not result.is_error, result.content[0].text
    data = result.structured_content
    assert data["verdict"] == "safe" and data["loaded"] is False and data["format"] == "safetensors"
    skipped = next(f for f in data["findings"] if f["code"] == "checks_skipped_without_torch")
    assert "--python" in skipped["message"] and "torch-skills[torch]" in skipped["message"]
    assert "Static scan only" in data["summary"]
    assert not marker.exists()


async def test_a_worker_without_torch_scans_statically_and_refuses_everything_else(tmp_path: Path):
    """Under an interpreter with no torch at all, the --without-torch worker runs the static scan only."""
    from tests.project_envs import make_env
    from torch_skills.checkpoint.models import VerifyCheckpointRequest
    from torch_skills.runner.errors import WorkerError
    from torch_skills.runner.pool import WorkerPool

    python = make_env(tmp_path / "notorch", with_torch=False)
    path = _checkpoint(tmp_path)
    async with WorkerPool(python=str(python), without_torch=True) as pool:
        job = await pool.run(
            "torch_skills.checkpoint.static_only:run",
            VerifyCheckpointRequest(path=str(path)),
            timeout_s=60,
            memory_limit_bytes=1 << 30,
            device="cpu",
            cwd=tmp_path,
            allowed_roots=[tmp_path],
        )
        assert job.result["verdict"] == "safe" and job.torch_version == ""
        with pytest.raises(WorkerError, match="No Python with torch"):
            await pool.run(
                "torch_skills.gradients.worker:run",
                VerifyCheckpointRequest(path=str(path)),
                timeout_s=60,
                memory_limit_bytes=1 << 30,
                device="cpu",
                cwd=tmp_path,
                allowed_roots=[tmp_path],
            )


@pytest.mark.slow  # starts two workers (the server's own Python, then the project's): about 15 s
async def test_files_only_calls_run_under_the_servers_python_and_model_calls_under_the_projects(project):
    """verify_checkpoint(path) leaves the sentinel alone; check_gradients(model=...) runs it and reports the link."""
    root, link, marker = project
    path = _checkpoint(root)
    async with entered_in_own_task(lambda: Client(build_server(prewarm=True))) as client:
        files_only = await client.call_tool("verify_checkpoint", {"path": str(path)})
        assert not files_only.is_error, files_only.content[0].text
        assert files_only.structured_content["run"]["python"] == sys.executable
        assert not marker.exists()
        with_model = await client.call_tool(
            "check_gradients", {"model": "m.py:build", "input_shape": [2, 4], "device": "cpu"}
        )
    assert not with_model.is_error, with_model.content[0].text
    assert marker.exists()
    assert with_model.structured_content["run"]["python"] == str(link)  # as found, not the resolved script

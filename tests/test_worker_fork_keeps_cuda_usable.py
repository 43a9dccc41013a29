"""CUDA calls run in a child that can use CUDA: a fresh interpreter, never a fork of the warm worker.

Measured on an H100 (torch 2.11+cu130): every CUDA call of every tool, through the forked children, failed
with "CUDA error: initialization error" while the same code in a plain process worked; it persisted after
the zygote stopped asking torch.cuda.is_available() itself (something it imports sets up the driver).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from torch_skills.runner.child import resolve_device

TOOLS = str(Path(__file__).resolve().parents[1] / "tools")

CHECK = """
import os, sys
sys.path.insert(0, {tools!r})
from torch_skills.runner.child import close_inherited_fds
kept = os.open({kept!r}, os.O_RDONLY)
dropped = os.open({dropped!r}, os.O_RDONLY)
close_inherited_fds(keep_prefixes=({kept!r},))
def is_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
print(is_open(kept), is_open(dropped))
"""


def test_the_child_keeps_the_driver_files_open_and_closes_every_other_inherited_descriptor():
    """Descriptors on the kept prefix (the GPU driver's /dev/nvidia* files) survive; the rest close."""
    with tempfile.TemporaryDirectory() as tmp:
        kept, dropped = Path(tmp, "nvidia-like"), Path(tmp, "other-job-pipe")
        kept.write_text("")
        dropped.write_text("")
        code = CHECK.format(tools=TOOLS, kept=str(kept), dropped=str(dropped))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "False"], out.stderr


def test_the_device_is_resolved_in_the_child_from_what_the_call_asked():
    """'cpu' and 'cuda' pass through; 'auto' asks torch in the child (CPU here, and in a worker without torch)."""
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("cuda") == "cuda"
    import torch

    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


def test_cuda_calls_start_a_fresh_interpreter_and_cpu_calls_fork(monkeypatch):
    """A call on CUDA never forks (a driver set up in the zygote by any library breaks a forked child)."""
    import torch

    from torch_skills.runner.zygote import START_ENV, Zygote

    monkeypatch.delenv(START_ENV, raising=False)
    zygote = Zygote(out_fd=-1)
    assert zygote.fresh_interpreter_for("cuda") is True
    assert zygote.fresh_interpreter_for("cpu") is False
    assert zygote.fresh_interpreter_for("auto") is torch.cuda.is_available()
    monkeypatch.setenv(START_ENV, "spawn")
    assert zygote.fresh_interpreter_for("cpu") is True


async def test_a_call_in_a_fresh_interpreter_gives_the_same_result_as_a_forked_one(monkeypatch):
    """With every call spawned (the path CUDA calls take), check_gradients runs and finds the same NaN."""
    from mcp import Client

    from tests.conftest import FIXTURES
    from torch_skills.runner.zygote import START_ENV
    from torch_skills.server import build_server

    request = {"model": f"{FIXTURES / 'gradient_zoo.py'}:log_of_zero", "input_shape": [8, 16], "seed": 0}
    monkeypatch.setenv(START_ENV, "spawn")
    async with Client(build_server(allow=[FIXTURES])) as spawned_client:
        spawned = await spawned_client.call_tool("check_gradients", request)
    monkeypatch.setenv(START_ENV, "fork")
    async with Client(build_server(allow=[FIXTURES])) as forked_client:
        forked = await forked_client.call_tool("check_gradients", request)
    assert not spawned.is_error, spawned.content
    assert spawned.structured_content["nonfinite"] == forked.structured_content["nonfinite"]
    assert spawned.structured_content["nonfinite"]["op"] == "log"


async def test_a_cuda_call_without_a_gpu_is_a_clear_error_from_the_fresh_interpreter(client):
    """The spawned path reports a missing GPU as the user's fix, like the forked one did."""
    import pytest
    import torch

    from tests.conftest import FIXTURES

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    r = await client.call_tool(
        "check_gradients",
        {"model": f"{FIXTURES / 'gradient_zoo.py'}:log_of_zero", "input_shape": [8, 16], "device": "cuda"},
    )
    assert r.is_error and "no CUDA device; use 'cpu' or 'auto'" in r.content[0].text

"""CUDA calls run in a child that can use CUDA: a fresh interpreter, never a fork of the warm worker.

Measured on an H100 (torch 2.11+cu130): every CUDA call of every tool, through the forked children, failed
with "CUDA error: initialization error" while the same code in a plain process worked; it persisted after
the zygote stopped asking torch.cuda.is_available() itself (something it imports sets up the driver).
"""

from __future__ import annotations

from torch_skills.runner.zygote import START_ENV, Zygote


def test_the_device_is_resolved_once_in_the_zygote_from_what_the_call_asked():
    """'cpu' and 'cuda' pass through; 'auto' asks torch once (CPU here)."""
    import torch

    zygote = Zygote(out_fd=-1)
    assert zygote.device_for("cpu") == "cpu"
    assert zygote.device_for("cuda") == "cuda"
    assert zygote.device_for("auto") == ("cuda" if torch.cuda.is_available() else "cpu")


def test_cuda_calls_start_a_fresh_interpreter_and_cpu_calls_fork(monkeypatch):
    """A call on CUDA never forks (a driver set up in the zygote by any library breaks a forked child)."""
    monkeypatch.delenv(START_ENV, raising=False)
    assert Zygote.fresh_interpreter_for("cuda") is True
    assert Zygote.fresh_interpreter_for("cpu") is False
    monkeypatch.setenv(START_ENV, "spawn")
    assert Zygote.fresh_interpreter_for("cpu") is True
    monkeypatch.setenv(START_ENV, "fork")
    assert Zygote.fresh_interpreter_for("cuda") is False


async def test_a_call_in_a_fresh_interpreter_gives_the_same_result_as_a_forked_one(monkeypatch):
    """With every call spawned (the path CUDA calls take), check_gradients runs and finds the same NaN."""
    from mcp import Client

    from tests.conftest import FIXTURES
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

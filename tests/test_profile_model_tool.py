"""profile_model end to end over MCP: the trace file, argument checks, and the scenarios on CUDA.

The CPU scenarios (evals/scenarios/profile_model.py) run in `pytest evals/` through
evals/test_diagnoses.py; the GPU tests here reuse them with device='cuda'. Paths in them are
relative to the repository root, the server's working directory when pytest runs from there.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evals.framework import Scenario
from evals.scenarios.profile_model import MODELS, SCENARIOS

REPO = Path(__file__).resolve().parents[1]
SCRATCH = REPO / ".pytest_cache" / "profile_model"  # inside the server's root, ignored by git


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


async def test_a_chrome_trace_is_written_under_an_allowed_root(client):
    """trace_path gets a Chrome trace holding the phase markers of the profiled steps."""
    shutil.rmtree(SCRATCH, ignore_errors=True)
    target = SCRATCH / "nested" / "step.json"
    try:
        r = await client.call_tool(
            "profile_model",
            {
                "model": f"{MODELS}:small_mlp",
                "input_shape": [8, 64],
                "active_steps": 3,
                "trace_path": str(target.relative_to(REPO)),
            },
        )
        assert not r.is_error, r.content[0].text
        assert r.structured_content["trace_path"] == str(target)
        names = {event.get("name") for event in json.loads(target.read_text())["traceEvents"]}
        assert {"## phase: forward", "## phase: backward", "## module: 0"} <= names
    finally:
        shutil.rmtree(SCRATCH, ignore_errors=True)


async def test_the_tool_is_listed_with_its_structured_output(client):
    """profile_model advertises an output schema carrying the verdict, its evidence and the findings."""
    tools = {t.name: t for t in (await client.list_tools()).tools}
    schema = tools["profile_model"].output_schema
    assert {"bottleneck", "evidence", "findings", "top_ops", "step_time_s", "run"} <= set(
        schema["properties"]
    )


async def test_too_few_active_steps_are_refused_before_any_code_runs(client):
    """An IQR needs at least three timed steps; the SDK rejects fewer with a message."""
    r = await client.call_tool(
        "profile_model", {"model": f"{MODELS}:small_mlp", "input_shape": [8, 64], "active_steps": 1}
    )
    assert r.is_error
    assert "active_steps" in r.content[0].text


async def test_a_request_without_any_input_says_which_to_give(client):
    """No data, inputs or input_shape: the error lists the three ways to give batches."""
    r = await client.call_tool("profile_model", {"model": f"{MODELS}:small_mlp"})
    assert r.is_error
    assert "give data" in r.content[0].text


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "scenario",
    [s for s in SCENARIOS if s.expect_error is None and "data" not in s.arguments],
    ids=lambda s: s.id,
)
async def test_the_scenarios_run_on_cuda_with_device_time(client, scenario: Scenario):
    """On a GPU each scenario runs, ranks ops by CUDA time, and reports peak memory from the allocator."""
    args = {**scenario.arguments, "device": "cuda"}
    r = await client.call_tool(scenario.tool, args)
    assert not r.is_error, r.content[0].text
    result = r.structured_content
    assert result["device"].startswith("cuda")
    assert result["peak_memory_kind"] == "cuda_max_allocated"
    assert all(op["self_device_time_s"] is not None for op in result["top_ops"])
    assert result["bottleneck"] in {"data_loading", "cpu_overhead", "compute", "memory_bandwidth", "unknown"}


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
async def test_a_large_bf16_matmul_on_cuda_reports_mfu_against_the_datasheet(client):
    """A known GPU gets its dense bf16 peak and an MFU between 0 and 1."""
    r = await client.call_tool(
        "profile_model",
        {
            "model": f"{MODELS}:big_matmul",
            "input_shape": [8192, 1024],
            "mode": "inference",
            "precision": "bf16",
            "device": "cuda",
        },
    )
    assert not r.is_error, r.content[0].text
    result = r.structured_content
    assert result["flops_per_step"] == 2 * 8192 * 1024 * 1024
    if result["peak_flops_per_s"] is not None:
        assert 0 < result["mfu"] <= 1.0
        assert "bf16" in result["peak_flops_source"]


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
async def test_item_every_layer_on_cuda_is_a_warning(client):
    """On a GPU the per-layer .item() calls are device syncs: warning severity, each module named."""
    r = await client.call_tool(
        "profile_model", {"model": f"{MODELS}:sync_every_layer", "input_shape": [16, 32], "device": "cuda"}
    )
    assert not r.is_error, r.content[0].text
    result = r.structured_content
    assert result["host_syncs_per_step"] == 8
    syncs = [f for f in result["findings"] if f["code"] == "host_sync"]
    assert syncs and syncs[0]["severity"] == "warning"

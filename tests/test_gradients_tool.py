"""check_gradients end to end through the MCP client: structured results, argument errors, roots."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from mcp import Client

from tests.conftest import FIXTURES

ZOO = str(FIXTURES / "gradient_zoo.py")


async def test_a_healthy_model_returns_structured_results_with_run_facts(client: Client):
    """The structured content holds the loss, every parameter, the summary and how the code ran."""
    r = await client.call_tool("check_gradients", {"model": f"{ZOO}:healthy_mlp", "input_shape": [8, 16]})
    assert not r.is_error, r.content
    data = r.structured_content
    assert data["mode"] == "model" and data["findings"] == []
    assert data["loss"]["finite"] is True and data["loss"]["how"].startswith("mean of the output")
    assert [p["name"] for p in data["parameters"]] == [
        "0.weight",
        "0.bias",
        "2.weight",
        "2.bias",
        "4.weight",
        "4.bias",
    ]
    assert data["run"]["device"] == "cpu" and data["run"]["torch_version"]
    assert data["run"]["wall_time_s"] > 0
    assert data["summary"].startswith("No gradient problems")


async def test_a_forward_nan_is_located_through_mcp(client: Client):
    """log of zero comes back with module, op and source line in structured content."""
    r = await client.call_tool("check_gradients", {"model": f"{ZOO}:log_of_zero", "input_shape": [8, 16]})
    assert not r.is_error, r.content
    where = r.structured_content["nonfinite"]
    assert (where["phase"], where["module"], where["op"], where["inputs_finite"]) == (
        "forward",
        "log",
        "log",
        True,
    )
    assert where["source"] and "gradient_zoo.py:" in where["source"]
    assert r.structured_content["findings"][0]["skill"] == "debugging-techniques"


async def test_a_backward_nan_is_located_through_mcp(client: Client):
    """The backward-only NaN names its autograd node in a forked worker too."""
    r = await client.call_tool(
        "check_gradients",
        {"model": f"{ZOO}:sqrt_of_zero_backward", "inputs": f"{ZOO}:inputs_with_zero_rows"},
    )
    assert not r.is_error, r.content
    where = r.structured_content["nonfinite"]
    assert (where["phase"], where["autograd_node"], where["module"]) == (
        "backward",
        "SqrtBackward0",
        "normalize",
    )


async def test_gradcheck_mode_runs_through_mcp(client: Client):
    """function= switches to gradcheck and reports the worst Jacobian entry."""
    r = await client.call_tool(
        "check_gradients", {"function": f"{ZOO}:BadSquare", "inputs": f"{ZOO}:square_inputs"}
    )
    assert not r.is_error, r.content
    report = r.structured_content["gradcheck"]
    assert r.structured_content["mode"] == "gradcheck"
    assert report["passed"] is False and report["worst_input"] == [0, 1, 0]
    assert r.structured_content["findings"][0]["code"] == "gradcheck_failed"


async def test_giving_both_model_and_function_is_a_tool_error(client: Client):
    """The two modes exclude each other, and the error says which argument to give."""
    r = await client.call_tool(
        "check_gradients", {"model": f"{ZOO}:healthy_mlp", "function": f"{ZOO}:BadSquare", "input_shape": [3]}
    )
    assert r.is_error
    assert "give exactly one of model" in r.content[0].text


async def test_a_missing_factory_lists_the_ones_that_exist(client: Client):
    """A wrong factory name becomes a bad_request naming the callables the file has."""
    r = await client.call_tool("check_gradients", {"model": f"{ZOO}:no_such_model", "input_shape": [8, 16]})
    assert r.is_error
    text = r.content[0].text
    assert "[bad_request]" in text and "healthy_mlp" in text


async def test_an_exception_in_forward_is_a_tool_error_with_the_message(client: Client):
    """A shape mismatch in the user's forward comes back as user_exception with torch's message."""
    r = await client.call_tool(
        "check_gradients",
        {"model": f"{FIXTURES}/malicious/gradient_faults.py:shape_mismatch", "input_shape": [8, 16]},
    )
    assert r.is_error
    text = r.content[0].text
    assert "[user_exception]" in text and "the forward pass" in text and "mat1 and mat2" in text


async def test_a_model_outside_the_allowed_roots_is_refused_naming_the_roots(client: Client):
    """A perfectly good model file in a fresh temp dir is refused before any code runs."""
    outside = Path(tempfile.mkdtemp(prefix="outside-roots-")) / "net.py"
    outside.write_text("import torch\n\ndef build():\n    return torch.nn.Linear(4, 2)\n")
    r = await client.call_tool("check_gradients", {"model": f"{outside}:build", "input_shape": [2, 4]})
    assert r.is_error
    text = r.content[0].text
    assert "outside the allowed roots" in text
    assert str(FIXTURES) in text and str(Path.cwd().resolve()) in text
    assert "--allow" in text


async def test_an_inputs_or_loss_file_outside_the_roots_is_refused_too(client: Client):
    """Every file a request names is checked, not only the model."""
    outside = Path(tempfile.mkdtemp(prefix="outside-roots-")) / "data.py"
    outside.write_text("import torch\n\ndef make_inputs():\n    return torch.randn(2, 16)\n")
    for argument in ("inputs", "loss"):
        r = await client.call_tool(
            "check_gradients",
            {"model": f"{ZOO}:healthy_mlp", "input_shape": [2, 16], argument: f"{outside}:make_inputs"},
        )
        assert r.is_error and "outside the allowed roots" in r.content[0].text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
async def test_nan_localization_works_the_same_on_cuda(client: Client):
    """Forward and backward NaNs are located on a CUDA device as on the CPU."""
    forward = await client.call_tool(
        "check_gradients", {"model": f"{ZOO}:log_of_zero", "input_shape": [8, 16], "device": "cuda"}
    )
    backward = await client.call_tool(
        "check_gradients",
        {"model": f"{ZOO}:sqrt_of_zero_backward", "inputs": f"{ZOO}:inputs_with_zero_rows", "device": "cuda"},
    )
    assert not forward.is_error and not backward.is_error
    assert forward.structured_content["run"]["device"].startswith("cuda")
    assert forward.structured_content["nonfinite"]["op"] == "log"
    assert backward.structured_content["nonfinite"]["autograd_node"] == "SqrtBackward0"


async def _fp16_overflow(client: Client, device: str):
    return await client.call_tool(
        "check_gradients",
        {"model": f"{ZOO}:fp16_autocast_overflow", "input_shape": [8, 16], "device": device, "seed": 0},
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
async def test_an_overflow_under_cuda_float16_autocast_is_located_at_its_op(client: Client):
    """A float16 overflow inside the model's own CUDA autocast region is found at the op that made it."""
    r = await _fp16_overflow(client, "cuda")
    assert not r.is_error, r.content
    assert r.structured_content["run"]["device"].startswith("cuda")
    assert r.structured_content["nonfinite"]["op"] == "mul"
    assert r.structured_content["nonfinite"]["module"] == "energy"


async def test_an_overflow_under_cpu_float16_autocast_is_located_at_its_op(client: Client):
    """The same model on CPU (autocast float16 exists there too) gives the same place."""
    r = await _fp16_overflow(client, "cpu")
    assert not r.is_error, r.content
    assert r.structured_content["nonfinite"]["op"] == "mul"
    assert r.structured_content["nonfinite"]["module"] == "energy"


async def test_the_seed_fixes_the_models_initial_weights_across_calls(client: Client):
    """Weights drawn at build time follow `seed`: the same seed gives the same loss on every call,
    another seed another loss (the worker's own random state never leaks into the model)."""

    async def loss(seed: int) -> float:
        r = await client.call_tool(
            "check_gradients", {"model": f"{ZOO}:healthy_mlp", "input_shape": [8, 16], "seed": seed}
        )
        assert not r.is_error, r.content
        return r.structured_content["loss"]["value"]

    first, again, other = await loss(3), await loss(3), await loss(4)
    assert first == again
    assert first != other

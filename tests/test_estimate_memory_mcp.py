"""estimate_memory end to end: through the MCP server, its worker pool and a forked child."""

from __future__ import annotations

from typing import get_args

import pytest

from torch_skills.results import SkillName

MODELS = "tests/fixtures/memory_models.py"
SKILLS = set(get_args(SkillName))
LLAMA_7B_PARAMS = (
    6_738_415_616  # 32000*4096*2 (embedding, output) + 32 * (4*4096^2 + 3*4096*11008 + 2*4096) + 4096
)
LLAMA_7B_TENSORS = 1 + 32 * 9 + 2  # embedding, 9 per block, final norm, output


async def test_estimate_memory_answers_over_mcp_with_a_structured_result(client):
    """A small GPT estimate comes back as structured content: peak, breakdown, phase, module, savers, findings."""
    r = await client.call_tool(
        "estimate_memory",
        {
            "model": f"{MODELS}:build_gpt",
            "inputs": f"{MODELS}:gpt_inputs",
            "loss": f"{MODELS}:next_token_loss",
            "batch_size": 4,
            "precision": "bf16_autocast",
        },
    )
    assert not r.is_error, r.content
    out = r.structured_content
    assert out["method"] == "traced" and out["target_device"] == "cuda" and out["batch_size"] == 4
    assert sum(out["breakdown"].values()) == out["peak_allocated_bytes"] <= out["peak_reserved_bytes"]
    assert out["peak_device_bytes"] == out["peak_reserved_bytes"] + out["cuda_context_bytes"]
    assert out["peak_phase"] in ("forward", "backward", "optimizer_step")
    assert out["top_activation_modules"] and all(m["saved_bytes"] > 0 for m in out["top_activation_modules"])
    assert out["run"]["device"] == "cpu" and out["summary"].startswith("Peak ")
    assert all(f["skill"] in SKILLS for f in out["findings"])


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_a_7b_decoder_is_estimated_without_allocating_it(client):
    """Llama-2-7B shapes in bf16 with AdamW: exact parameter bytes and Adam state, far beyond this machine's RAM."""
    r = await client.call_tool(
        "estimate_memory",
        {
            "model": f"{MODELS}:build_llama",
            "model_kwargs": {"config": "7b"},
            "inputs": f"{MODELS}:llama7b_inputs",
            "loss": f"{MODELS}:next_token_loss",
            "precision": "bf16",
            "optimizer": "adamw",
        },
    )
    assert not r.is_error, r.content
    out = r.structured_content
    assert out["parameter_count"] == LLAMA_7B_PARAMS
    assert out["parameter_bytes"] == 2 * LLAMA_7B_PARAMS
    assert out["breakdown"]["parameters"] == 2 * LLAMA_7B_PARAMS  # every bf16 tensor is a multiple of 512 B
    # two bf16 moments per parameter, plus a float32 `step` scalar per tensor in its own 512 B block
    assert out["breakdown"]["optimizer_state"] == 4 * LLAMA_7B_PARAMS + 512 * LLAMA_7B_TENSORS
    assert (
        out["peak_allocated_bytes"] > 6 * LLAMA_7B_PARAMS
    )  # weights + gradients + state: 8 bytes per parameter at least
    assert out["method"] == "traced"


async def test_inference_holds_no_gradients_or_optimizer_state(client):
    """mode='inference' runs the forward under no_grad: the peak is in forward with nothing saved for backward."""
    r = await client.call_tool(
        "estimate_memory",
        {
            "model": f"{MODELS}:build_llama",
            "inputs": f"{MODELS}:llama_inputs",
            "mode": "inference",
            "target_device": "cpu",
        },
    )
    assert not r.is_error, r.content
    out = r.structured_content
    assert out["peak_phase"] == "forward" and out["optimizer"] == "none"
    assert (
        out["breakdown"]["gradients"]
        == out["breakdown"]["optimizer_state"]
        == out["breakdown"]["activations"]
        == 0
    )
    assert out["peak_reserved_bytes"] == out["peak_allocated_bytes"] and out["cuda_context_bytes"] == 0


async def test_a_missing_factory_is_a_tool_error_that_lists_the_callables(client):
    """Naming a factory the file does not have returns a tool error with the callables it does have."""
    r = await client.call_tool(
        "estimate_memory", {"model": f"{MODELS}:build_resnet50", "input_shape": [2, 3, 32, 32]}
    )
    assert r.is_error
    text = r.content[0].text
    assert "build_resnet50" in text and "build_resnet" in text

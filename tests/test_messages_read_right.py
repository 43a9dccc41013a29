"""Errors and findings read right: the user's own line first, the batch that ran, no log noise, no empty names.

Run: `python -m pytest tests/test_messages_read_right.py`.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from mcp import Client

from tests.conftest import FIXTURES
from tests.owned import entered_in_own_task
from torch_skills.profiling.findings import _verdict_words
from torch_skills.server import build_server

MODELS = str(FIXTURES / "wording_models.py")


async def test_a_wrong_input_layout_shows_the_users_line_before_torch_frames(client: Client):
    """NHWC into a conv: the error names model.py's line and lists the user's frame first."""
    r = await client.call_tool(
        "check_gradients", {"model": f"{MODELS}:channels_first", "input_shape": [2, 16, 16, 3]}
    )
    assert r.is_error
    text = r.content[0].text
    assert "wording_models.py:16" in text.splitlines()[0]
    assert text.index("Your code") < text.index("site-packages/torch")
    assert "features = self.conv(x)" in text


async def test_a_lazy_module_that_fails_its_first_forward_is_the_users_error_not_the_tools(client: Client):
    """An uninitialized LazyLinear is skipped by the NaN check, so the real forward error comes back."""
    r = await client.call_tool(
        "check_gradients", {"model": f"{MODELS}:lazy_sequential", "input_shape": [2, 16, 16, 3]}
    )
    assert r.is_error
    text = r.content[0].text
    assert "[user_exception]" in text and "expected input[2, 16, 16, 3] to have 3 channels" in text
    assert "bug in the tool" not in text


async def test_an_estimate_shape_error_says_the_batch_that_ran_and_carries_no_fake_tensor_log(client: Client):
    """The fallback's first real step (batch 2) is named as such, and torch's fake-tensor log stays out."""
    r = await client.call_tool(
        "estimate_memory", {"model": f"{MODELS}:mismatched_linears", "input_shape": [8, 16]}
    )
    assert r.is_error
    text = r.content[0].text
    assert "at batch size 2" in text and "tracing at batch size 8" in text
    assert "fake_tensor.py" not in text and "failed while attempting to run meta" not in text


async def test_activations_saved_by_the_root_forward_get_no_empty_checkpointing_target(client: Client):
    """No "activation_checkpointing=['']": the advice says there is no block to wrap."""
    r = await client.call_tool(
        "estimate_memory", {"model": f"{MODELS}:root_only_forward", "input_shape": [8192, 128]}
    )
    assert not r.is_error, r.content
    finding = next(f for f in r.structured_content["findings"] if f["code"] == "activations_dominate")
    assert "['']" not in finding["message"] and "wrap  in" not in finding["message"]
    assert "no block to checkpoint" in finding["message"]


def test_a_roofline_resource_far_from_its_limit_is_not_called_the_bound():
    """12% of the copy rate is "closest to", not "bound by"; 80% of the matmul rate is "bound by"."""
    far = SimpleNamespace(
        bottleneck="memory_bandwidth", shares=SimpleNamespace(compute=0.03, memory_bandwidth=0.12)
    )
    near = SimpleNamespace(bottleneck="compute", shares=SimpleNamespace(compute=0.8, memory_bandwidth=0.1))
    far_words = _verdict_words(far, "memory traffic at 12% of the attainable copy rate")
    assert not far_words.startswith("Bound by") and "memory traffic" in far_words and "12%" in far_words
    assert "memory_bandwidth" not in far_words
    assert _verdict_words(near, "arithmetic at 80%").startswith("Bound by arithmetic")


async def test_a_desktop_style_server_in_the_root_folder_takes_paths_relative_to_its_allowed_folder(
    tmp_path: Path, monkeypatch
):
    """Started in / with --allow PROJECT (as Claude Desktop does), `model.py:build` means PROJECT/model.py."""
    (tmp_path / "model.py").write_text(
        "import torch\n\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(4, 2))\n"
    )
    monkeypatch.chdir("/")
    async with entered_in_own_task(lambda: Client(build_server(allow=[tmp_path], prewarm=False))) as c:
        r = await c.call_tool("check_gradients", {"model": "model.py:build", "input_shape": [2, 4]})
    assert not r.is_error, r.content
    assert [p["name"] for p in r.structured_content["parameters"]] == ["0.weight", "0.bias"]


def test_the_demo_prints_whole_findings_wrapped_never_cut_mid_word():
    """Every word of a long finding survives the demo's wrapping."""
    from examples.demo import _wrapped

    message = " ".join(f"word{i}" for i in range(120))
    wrapped = _wrapped(message)
    assert wrapped.startswith("   - word0 ") and " ".join(wrapped.split()[1:]) == message
    assert all(len(line) <= 100 for line in wrapped.splitlines())
    code = "Before load_state_dict:\nfrom x import y\ny(state_dict)"
    assert _wrapped(code).splitlines()[1:] == ["       from x import y", "       y(state_dict)"]


async def test_every_torch_tool_call_reports_progress_however_fast_it_ends(client: Client):
    """A fast verify_checkpoint sends a notification every time, the first before any work starts.

    (A notification that only follows the worker's first phase can race the result: the TypeScript
    client drops progress that arrives after the response, and its tour saw none 1 run in 2.)"""
    counts, first = [], []
    for _ in range(5):
        seen = []

        async def record(progress: float, total: float | None, message: str | None, seen=seen) -> None:
            seen.append((progress, message))

        r = await client.call_tool(
            "verify_checkpoint",
            {"path": "evals/models/verify_checkpoint_nan.safetensors"},
            progress_callback=record,
        )
        assert not r.is_error, r.content
        counts.append(len(seen))
        first.append(seen[0] if seen else None)
    assert min(counts) >= 1, counts
    assert all(f == (0.0, "verify_checkpoint: starting a worker process") for f in first), first

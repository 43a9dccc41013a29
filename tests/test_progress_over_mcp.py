"""Long tool calls report progress to MCP clients that ask for it."""

from __future__ import annotations

import pytest
from mcp import Client


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_profile_model_sends_progress_notifications_while_it_runs(client: Client):
    """A client passing progress_callback sees the stages of a multi-second profile."""
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    result = await client.call_tool(
        "profile_model",
        {
            "model": "evals/models/profile_model_scenarios.py:small_mlp",
            "data": "evals/models/profile_model_scenarios.py:sleepy_loader",
            "warmup_steps": 2,
            "active_steps": 5,
            "cpu_threads": 1,
        },
        progress_callback=on_progress,
    )
    assert not result.is_error, result.content[0].text
    assert len(seen) >= 2
    # heartbeats sent before the worker's first report carry no total (it is not known yet)
    assert all(0 <= done <= total for done, total, _ in seen if total is not None)
    assert any(total is not None for _, total, _ in seen)
    assert all(b > a for (a, _, _), (b, _, _) in zip(seen, seen[1:], strict=False))
    assert any(message for _, _, message in seen)

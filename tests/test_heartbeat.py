"""Long tool calls stay alive: progress at least every heartbeat interval, always increasing."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client

from tests.fixtures.slow_jobs import SleepRequest, SleepResult
from torch_skills.heartbeat import Heartbeat
from torch_skills.server import build_server
from torch_skills.torch_tools import TorchTool

SLEEPY = TorchTool(
    name="sleepy",
    request=SleepRequest,
    result=SleepResult,
    worker="tests.fixtures.slow_jobs:sleep",
    description="Wait `seconds` in a worker (heartbeat tests).",
)


async def test_heartbeats_fill_the_silence_between_worker_phases_with_increasing_values():
    """Beats come every interval, phases pass through, values only go up and stay below the next step."""
    sent: list[tuple[float, float | None, str | None]] = []

    async def send(progress: float, total: float | None, message: str | None) -> None:
        sent.append((progress, total, message))

    async with Heartbeat(send, label="tool", interval_s=0.05) as beat:
        beat.status("queued")
        await anyio.sleep(0.18)
        await beat.phase(1, 3, "building the model")
        await anyio.sleep(0.18)
        await beat.phase(2, 3, "forward and backward")
        await beat.phase(2, 3, "same step again")  # a worker value that does not increase
        await anyio.sleep(0.12)
    values = [p for p, _, _ in sent]
    assert all(b > a for a, b in zip(values, values[1:], strict=False)), values
    assert sent[0][2].startswith("tool: queued (still running")
    assert any(m == "tool: building the model" for _, _, m in sent)
    between = [p for p, _, m in sent if "building the model (still running" in m]
    assert between and all(1 < p < 1.5 for p in between)
    assert all(t is None or p <= t for p, t, _ in sent)
    assert len(sent) >= 8


async def test_a_heartbeat_that_cannot_be_delivered_does_not_stop_the_job():
    """A client that went away makes sends fail; the job goes on."""

    async def send(progress: float, total: float | None, message: str | None) -> None:
        raise anyio.BrokenResourceError

    async with Heartbeat(send, label="tool", interval_s=0.02) as beat:
        await anyio.sleep(0.1)
    assert len(beat.sent) >= 3


@pytest.mark.slow
async def test_a_25_second_job_sends_progress_at_least_every_heartbeat_interval():
    """Through MCP, a job that sleeps 25 s reports progress at <= 3 s gaps (3 s heartbeat), increasing."""
    events: list[tuple[float, float, str | None]] = []
    clock = anyio.current_time

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        events.append((clock(), progress, message))

    server = build_server(heartbeat_s=3.0, torch_tools=[SLEEPY], prewarm=False)
    async with Client(server) as client:
        start = clock()
        result = await client.call_tool(
            "sleepy",
            {"model": "tests/fixtures/client_models.py:build", "input_shape": [2, 16], "seconds": 25},
            progress_callback=on_progress,
        )
    assert not result.is_error, result.content[0].text
    assert result.structured_content["slept_s"] >= 25
    times = [start] + [t for t, _, _ in events]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps) <= 3.0 + 1.0, gaps  # 1 s of slack for a loaded machine
    values = [p for _, p, _ in events]
    assert all(b > a for a, b in zip(values, values[1:], strict=False))
    assert any("sleepy: waiting (still running" in (m or "") for _, _, m in events)


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_a_call_waiting_for_a_worker_slot_says_it_is_queued():
    """With one slot busy, the second call's heartbeats say it is queued, then it runs."""
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    arguments = {"model": "tests/fixtures/client_models.py:build", "input_shape": [2, 16], "seconds": 3}
    server = build_server(heartbeat_s=0.5, torch_tools=[SLEEPY], max_jobs=1, prewarm=False)
    async with Client(server) as client, anyio.create_task_group() as tg:
        tg.start_soon(lambda: client.call_tool("sleepy", arguments))
        await anyio.sleep(0.2)
        second = await client.call_tool("sleepy", arguments, progress_callback=on_progress)
    assert not second.is_error
    assert any("waiting for a free worker (1 ahead)" in m for m in messages), messages


def test_the_pytest_heartbeat_reaches_the_log_while_output_is_captured(tmp_path):
    """A test silent past the interval gets a "[still running ...]" line even under pytest's fd capture."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.heartbeat"]\n')
    (tmp_path / "test_quiet.py").write_text("import time\n\ndef test_quiet():\n    time.sleep(2.5)\n")
    env = {**os.environ, "PYTHONPATH": str(repo), "TORCH_SKILLS_TEST_HEARTBEAT_S": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull, "test_quiet.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[still running after" in done.stderr and "test_quiet.py::test_quiet" in done.stderr

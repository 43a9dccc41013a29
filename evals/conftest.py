"""`pytest evals/`: scores routing and tool diagnoses through the MCP server, prints the table."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from evals import scoring
from server import build_server

REPORT = Path(__file__).with_name("report.md")


async def _hold(ready: asyncio.Future, done: asyncio.Event) -> None:
    async with Client(build_server()) as c:  # one task owns the client's cancel scopes
        ready.set_result(c)
        await done.wait()


@pytest.fixture(scope="session")
async def client() -> AsyncIterator[Client]:
    """An in-memory client on the real server, shared by every eval."""
    ready: asyncio.Future = asyncio.get_running_loop().create_future()
    done = asyncio.Event()
    task = asyncio.create_task(_hold(ready, done))
    await asyncio.wait({ready, task}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    yield ready.result()
    done.set()
    await task


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not scoring.ROUTING and not scoring.SCENARIOS:
        return
    report = scoring.render_markdown()
    REPORT.write_text(report)
    terminalreporter.write_sep("=", "torch-skills eval scores")
    terminalreporter.write_line(report)
    terminalreporter.write_line(f"(written to {REPORT})")

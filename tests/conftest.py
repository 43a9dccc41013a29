"""Shared fixtures: one in-memory MCP client on the real server for the whole test session."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from server import build_server

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures"


@pytest.fixture(scope="session")
async def client() -> AsyncIterator[Client]:
    """An in-memory Client connected to build_server(); its warm worker is shared by all tests.

    The client lives in a task of its own: pytest-asyncio runs a fixture's setup and teardown in
    different tasks, and anyio refuses to exit a task group (the client's, the worker pool's) from
    a task other than the one that entered it.
    """
    ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
    finished = asyncio.Event()

    async def hold() -> None:
        async with Client(build_server(allow=[FIXTURES])) as c:
            ready.set_result(c)
            await finished.wait()

    def startup_failed(task: asyncio.Task) -> None:
        if not ready.done():
            error = None if task.cancelled() else task.exception()
            ready.set_exception(error or RuntimeError("the MCP client stopped before it was ready"))

    holder = asyncio.create_task(hold())
    holder.add_done_callback(startup_failed)
    try:
        yield await ready
    finally:
        finished.set()
        await holder

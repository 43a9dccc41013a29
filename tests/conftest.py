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

    The client is entered and exited inside one long-lived task: pytest-asyncio runs a fixture's
    setup and teardown in different tasks, and anyio's cancel scopes must exit in the task that
    entered them.
    """
    ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
    done = asyncio.Event()

    async def hold() -> None:
        try:
            async with Client(build_server(allow=[FIXTURES])) as c:
                ready.set_result(c)
                await done.wait()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e)
            raise

    task = asyncio.create_task(hold())
    try:
        yield await ready
    finally:
        done.set()
        await task

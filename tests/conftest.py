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


async def _hold_client(ready: asyncio.Future, done: asyncio.Event, **server_options) -> None:
    # anyio cancel scopes must be exited by the task that entered them, so one task owns the client.
    async with Client(build_server(**server_options)) as c:
        ready.set_result(c)
        await done.wait()


@pytest.fixture(scope="session")
async def client() -> AsyncIterator[Client]:
    """An in-memory Client connected to build_server(); its warm worker is shared by all tests."""
    ready: asyncio.Future = asyncio.get_running_loop().create_future()
    done = asyncio.Event()
    task = asyncio.create_task(_hold_client(ready, done, allow=[FIXTURES]))
    await asyncio.wait({ready, task}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # the server failed to start: raise its error here
    c = ready.result()
    try:
        yield c
    finally:
        done.set()
        await task

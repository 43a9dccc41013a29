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

    The client is opened and closed inside one task of its own: pytest-asyncio runs a fixture's
    setup and teardown in different tasks, and anyio refuses to exit a cancel scope elsewhere.
    """
    opened: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
    finished = asyncio.Event()

    async def hold() -> None:
        try:
            async with Client(build_server(allow=[FIXTURES])) as c:
                opened.set_result(c)
                await finished.wait()
        except BaseException as exc:
            if not opened.done():
                opened.set_exception(exc)
            raise

    holder = asyncio.create_task(hold())
    try:
        yield await opened
    finally:
        finished.set()
        await holder

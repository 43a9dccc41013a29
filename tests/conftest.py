"""Shared fixtures: one in-memory MCP client on the real server for the whole test session."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from tests.owned import entered_in_own_task
from torch_skills.server import build_server

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures"


@pytest.fixture(scope="session")
async def client() -> AsyncIterator[Client]:
    """An in-memory Client connected to build_server(); its warm worker is shared by all tests."""
    async with entered_in_own_task(lambda: Client(build_server(allow=[FIXTURES]))) as c:
        yield c

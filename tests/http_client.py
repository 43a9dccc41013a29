"""An MCP client for the HTTP server, which needs its bearer token on every request.

Use: `async with http_client(url, token) as c: await c.call_tool(...)`; start the server with
`TORCH_SKILLS_TOKEN=<token>` in its environment (`TEST_TOKEN` is one that passes its checks).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from mcp import Client
from mcp.client.streamable_http import streamable_http_client

TEST_TOKEN = "t0ken-for-the-tests-only-0123456789"


@contextlib.asynccontextmanager
async def http_client(url: str, token: str = TEST_TOKEN) -> AsyncIterator[Client]:
    """A `Client` on `url` that sends `Authorization: Bearer <token>`."""
    import httpx2

    timeout = httpx2.Timeout(30, read=300)  # the SDK's own defaults: a response stream may stay open
    headers = {"authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client

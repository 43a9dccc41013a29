"""Serving over stdio so that every request gets an answer, even one that is not JSON-RPC.

Use it instead of `mcp.run()`:

    anyio.run(serve_stdio, build_server())

The SDK's stdio transport parses each line of stdin; a line that is not JSON (a typo, a cut-off
message, nesting deeper than the parser's limit of about 200 levels) or not a JSON-RPC message
becomes an exception that the SDK logs and drops, so a client waits for an answer that never
comes. Here each such line is answered with a JSON-RPC error: -32700 (parse error) or -32600
(invalid request), carrying the request's id when it could be read and null otherwise, as
JSON-RPC 2.0 asks. Everything else goes through the SDK unchanged.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any

from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError
from pydantic import ValidationError

log = logging.getLogger("torch-skills")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600


def error_reply(exc: Exception) -> JSONRPCError:
    """The JSON-RPC error that answers a line the SDK could not turn into a message."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if not errors or any(e.get("type") == "json_invalid" for e in errors):
        detail = str(errors[0].get("msg")) if errors else str(exc)
        return JSONRPCError(
            jsonrpc="2.0",
            id=None,
            error={
                "code": PARSE_ERROR,
                "message": f"Parse error: the message is not valid JSON ({detail[:200]})",
            },
        )
    request_id = None
    for e in errors:  # the validators saw the whole object: take its id if it has a usable one
        value = e.get("input")
        if (
            isinstance(value, dict)
            and isinstance(value.get("id"), (str, int))
            and not isinstance(value.get("id"), bool)
        ):
            request_id = value["id"]
            break
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "the message"
    return JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error={
            "code": INVALID_REQUEST,
            "message": f"Invalid request: not a JSON-RPC 2.0 message ({where}: {str(first.get('msg'))[:200]})",
        },
    )


class AnsweringReadStream:
    """The SDK's stdin read stream, with each unparseable line answered on `write_stream` and skipped."""

    def __init__(self, inner: Any, write_stream: Any):
        self.inner = inner
        self.write_stream = write_stream

    @property
    def last_context(self) -> Any:
        return getattr(self.inner, "last_context", None)

    async def receive(self) -> Any:
        while True:
            item = await self.inner.receive()
            if not isinstance(item, Exception):
                return item
            log.debug("answering an unparseable message: %r", item)
            await self.write_stream.send(SessionMessage(error_reply(item)))

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __aiter__(self) -> AnsweringReadStream:
        return self

    async def __anext__(self) -> Any:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> AnsweringReadStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        return None


async def serve_stdio(mcp: Any) -> None:
    """Serve `mcp` (an MCPServer) over stdin/stdout until stdin closes, as `mcp.run()` does."""
    from mcp.server.stdio import stdio_server

    lowlevel = mcp._lowlevel_server  # what MCPServer.run_stdio_async drives; no public accessor in 2.3
    async with stdio_server() as (read_stream, write_stream):
        await lowlevel.run(
            AnsweringReadStream(read_stream, write_stream),
            write_stream,
            lowlevel.create_initialization_options(),
        )

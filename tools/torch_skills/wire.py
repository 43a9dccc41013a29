"""Nothing leaves the server that is not valid UTF-8.

Use `install_wire_safety(mcp)` once on the MCPServer (build_server does), and `wire_safe(text)`
for strings sent outside a request's result (progress messages).

File names read from disk, exception messages and captured output may hold bytes that are not
UTF-8: Python carries them as lone surrogates ("\\udcff", surrogateescape), and a JSON string
can carry them too ("\\udc80" escapes in a request echoed back). The SDK's serializer refuses
such a string, which over stdio kills the writer (the server stops answering) and over HTTP
breaks the body. The middleware here walks every result dict and error message on its way out
and replaces each lone surrogate with U+FFFD, so the answer is what it would have been, minus
the undecodable byte.

Known limitations: notifications the SDK sends on its own (outside a request's result) are not
walked; the server's own notifications (progress) go through `wire_safe`.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR

REPLACEMENT = "\ufffd"


def wire_safe(text: str) -> str:
    """`text` with every lone surrogate (a byte that was not UTF-8) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return "".join(REPLACEMENT if "\ud800" <= ch <= "\udfff" else ch for ch in text)


def wire_safe_value(value: Any) -> Any:
    """Walk dicts, lists and tuples (keys included); return the same object when nothing changed."""
    if isinstance(value, str):
        return wire_safe(value)
    if isinstance(value, dict):
        changed = False
        out = {}
        for k, v in value.items():
            k2, v2 = wire_safe_value(k), wire_safe_value(v)
            changed = changed or k2 is not k or v2 is not v
            out[k2] = v2
        return out if changed else value
    if isinstance(value, (list, tuple)):
        items = [wire_safe_value(v) for v in value]
        if any(a is not b for a, b in zip(items, value, strict=True)):
            return type(value)(items) if isinstance(value, list) else tuple(items)
        return value
    return value


class WireSafety:
    """Server middleware: results and error messages leave as valid UTF-8."""

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        try:
            result = await call_next(ctx)
        except MCPError as e:
            message, data = wire_safe(e.error.message), wire_safe_value(e.error.data)
            if message is e.error.message and data is e.error.data:
                raise
            raise MCPError(e.error.code, message, data) from None
        except Exception as e:
            text = str(e)
            if wire_safe(text) is text:
                raise
            raise MCPError(INTERNAL_ERROR, wire_safe(text)) from None
        return wire_safe_value(result)


def install_wire_safety(mcp: MCPServer) -> None:
    """Add the WireSafety middleware to `mcp` (innermost, so it sees every handler's result)."""
    mcp._lowlevel_server.middleware.append(WireSafety())

"""The ASGI layer in front of the SDK's streamable-HTTP app: every check that needs no request body
runs before a byte of it is read.

Use it through `torch_skills.http_app.build_app`; directly:

    gate = HttpGate(sdk_app, token="...", security=TransportSecuritySettings(...), max_body_bytes=4 << 20,
                    body_timeout_s=30, max_sessions=64, max_sessions_per_client=32, session_idle_s=300,
                    live_sessions=lambda: open_session_ids, evict=close_session)

In order: the path must be the MCP endpoint; Host, Origin and (for a POST) Content-Type must pass
the SDK's DNS-rebinding checks; `Authorization: Bearer <token>` must match; a new session must fit
the client's share (`max_sessions_per_client` per remote address) and, when all `max_sessions`
are open, takes the place of the session unused for longest that has no call running; the body must declare (Content-Length) and then deliver at most
`max_body_bytes` within `body_timeout_s`. A refusal before the body is read closes the
connection, so the unread body is never received. Every refusal is a JSON-RPC error (id null).

When the client drops the connection before its answer, the requests it carried are cancelled
with the protocol's own `notifications/cancelled`, sent into the same session, so the call's
handler is cancelled and its worker process killed.

Known limitations: "client" is the remote address, so behind a reverse proxy or on loopback all
clients share one address and one share of the sessions.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import time
from collections.abc import Callable, Container, Iterator
from typing import Any

import pydantic_core

SESSION_HEADER = b"mcp-session-id"
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603


def jsonrpc_error_body(code: int, message: str) -> bytes:
    """A JSON-RPC 2.0 error object with id null: the answer to a request that was not read."""
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}).encode()


async def refuse(
    send: Any,
    status: int,
    message: str,
    *,
    code: int = INVALID_REQUEST,
    close: bool = True,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Answer with `status` and a JSON-RPC error; `close` ends the connection (an unread body stays unread)."""
    body = jsonrpc_error_body(code, message)
    extra = list(headers or [])
    if close:
        extra.append((b"connection", b"close"))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def request_ids(body: bytes) -> list[Any]:
    """The ids of the JSON-RPC requests in a POST body (one message or a batch); [] if none or not JSON.

    pydantic_core's parser is the SDK's: it fails cleanly (ValueError) on nesting too deep, where
    the standard library's json raises RecursionError."""
    try:
        data = pydantic_core.from_json(body)
    except ValueError:
        return []
    messages = data if isinstance(data, list) else [data]
    return [m["id"] for m in messages if isinstance(m, dict) and "method" in m and m.get("id") is not None]


def _why(status: int, headers: dict[bytes, bytes]) -> str:
    """The message for a refused Host (421), Origin (403) or Content-Type (400), with the fix."""

    def given(name: bytes) -> str:
        return repr(headers.get(name, b"").decode("latin-1")[:200])

    if status == 421:
        return (
            f"the Host header {given(b'host')} is not a name this server answers to; "
            "start the server with --allowed-host NAME to add one"
        )
    if status == 403:
        return (
            f"the Origin {given(b'origin')} may not call this server; "
            "start the server with --allowed-origin ORIGIN to allow a browser app"
        )
    return f"Content-Type must be application/json, got {given(b'content-type')}"


def _is_initialize(body: bytes) -> bool:
    try:
        data = pydantic_core.from_json(body)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("method") == "initialize"


class SessionShares:
    """Which client address opened which live session, and which sessions are busy: the per-client
    cap, and room for a newcomer when every session is taken.

    A session counts while the SDK still has it (`live_sessions`, when it can say) and it had a
    request within `idle_s` (the SDK closes sessions idle that long); opening requests still in
    flight count too, so a burst of them cannot overshoot the cap. When the server is full, the
    session unused for longest with no request in flight is closed (`evict`) to admit a new one,
    so sessions that one client leaves open cannot lock the others out."""

    def __init__(
        self,
        per_client: int,
        total: int,
        idle_s: float,
        live_sessions: Callable[[], Container[str] | None],
        evict: Callable[[str], bool],
    ):
        self.per_client = per_client
        self.total = total
        self.idle_s = idle_s
        self.live_sessions = live_sessions
        self.evict = evict
        self.owner: dict[str, str] = {}  # session id -> client address
        self.last_seen: dict[str, float] = {}
        self.busy: dict[str, int] = {}  # session id -> requests in flight (an open GET stream included)
        self.opening: dict[str, int] = {}  # client address -> opening requests in flight

    def _prune(self) -> None:
        live = self.live_sessions()
        now = time.monotonic()
        for sid in list(self.owner):
            stale = now - self.last_seen[sid] > self.idle_s and not self.busy.get(sid)
            if stale or (live is not None and sid not in live):
                self.closed(sid)

    def held_by(self, client: str) -> int:
        self._prune()
        return sum(1 for c in self.owner.values() if c == client) + self.opening.get(client, 0)

    async def make_room(self) -> bool:
        """Close the longest-unused idle session if the server is full; False when all are busy."""
        import anyio

        self._prune()
        if len(self.owner) + sum(self.opening.values()) < self.total:
            return True
        idle = [sid for sid in self.owner if not self.busy.get(sid)]
        if not idle:
            return False
        oldest = min(idle, key=self.last_seen.__getitem__)
        if not self.evict(oldest):
            return False
        self.closed(oldest)
        with anyio.move_on_after(2):  # the SDK forgets it on its next turn
            while (live := self.live_sessions()) is not None and oldest in live:
                await anyio.sleep(0.01)
        return True

    @contextlib.contextmanager
    def opening_for(self, client: str) -> Iterator[Callable[[str], None]]:
        """Count an opening request of `client` until it ends or the session it opened is known:
        the body calls the yielded function with the new session id (counted once, never twice)."""
        self.opening[client] = self.opening.get(client, 0) + 1
        pending = [True]

        def stop_counting() -> None:
            if pending[0]:
                pending[0] = False
                self.opening[client] -= 1
                if not self.opening[client]:
                    del self.opening[client]

        def opened(sid: str) -> None:
            self.opened(sid, client)
            stop_counting()

        try:
            yield opened
        finally:
            stop_counting()

    def seen(self, sid: str) -> None:
        if sid in self.owner:
            self.last_seen[sid] = time.monotonic()

    def opened(self, sid: str, client: str) -> None:
        self.owner[sid] = client
        self.last_seen[sid] = time.monotonic()

    def closed(self, sid: str) -> None:
        self.owner.pop(sid, None)
        self.last_seen.pop(sid, None)
        self.busy.pop(sid, None)

    @contextlib.contextmanager
    def in_flight(self, sid: str) -> Iterator[None]:
        self.busy[sid] = self.busy.get(sid, 0) + 1
        try:
            yield
        finally:
            if sid in self.busy:
                self.busy[sid] -= 1
            self.seen(sid)


class HttpGate:
    """See the module docstring."""

    def __init__(
        self,
        app: Any,
        *,
        token: str,
        security: Any,
        max_body_bytes: int,
        body_timeout_s: float,
        max_sessions: int,
        max_sessions_per_client: int,
        session_idle_s: float,
        live_sessions: Callable[[], Container[str] | None] = lambda: None,
        evict: Callable[[str], bool] = lambda sid: False,
        path: str = "/mcp",
    ):
        from mcp.server.transport_security import TransportSecurityMiddleware

        if not token:
            raise ValueError("HttpGate needs a token")
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.security = TransportSecurityMiddleware(security)
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.path = path
        self.shares = SessionShares(
            max_sessions_per_client, max_sessions, session_idle_s, live_sessions, evict
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.requests import Request

        if scope.get("path", "").rstrip("/") != self.path:
            await refuse(send, 404, f"no MCP endpoint here: the server answers at {self.path}")
            return
        method = scope.get("method")
        headers = dict(scope.get("headers") or [])
        problem = await self.security.validate_request(Request(scope), is_post=method == "POST")
        if problem is not None:  # 421 foreign Host, 403 foreign Origin, 400 wrong Content-Type
            await refuse(send, problem.status_code, _why(problem.status_code, headers))
            return
        if not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
            await refuse(
                send,
                401,
                "missing or wrong bearer token: send 'Authorization: Bearer <token>' (the token the "
                "server printed at start, or the one it was given with --token / TORCH_SKILLS_TOKEN)",
                headers=[(b"www-authenticate", b'Bearer realm="torch-skills"')],
            )
            return
        sid = headers.get(SESSION_HEADER, b"").decode("latin-1")
        if sid:
            self.shares.seen(sid)
        if method == "DELETE" and sid:
            self.shares.closed(sid)
        if method != "POST":
            with self.shares.in_flight(sid) if sid else contextlib.nullcontext():
                await self.app(scope, receive, send)
            return
        client = str((scope.get("client") or ("?", 0))[0])
        if not sid and self.shares.held_by(client) >= self.shares.per_client:
            await refuse(
                send,
                503,
                f"this client already holds {self.shares.per_client} sessions, the most one client may; "
                "reuse one (its mcp-session-id) or end one (DELETE /mcp with its mcp-session-id)",
                code=INTERNAL_ERROR,
            )
            return
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.max_body_bytes
            except ValueError:
                await refuse(send, 400, "Content-Length is not a number")
                return
            if too_big:
                await refuse(send, 413, self._too_big())
                return
        body = await self._read_body(receive, send)
        if body is None:
            return
        if sid:
            with self.shares.in_flight(sid):
                await self._forward(scope, receive, send, body)
            return
        # Only an initialize opens a session (the SDK refuses anything else without a session id), so
        # only an initialize may close an idle session to make room.
        if _is_initialize(body) and not await self.shares.make_room():
            await refuse(
                send,
                503,
                f"all {self.shares.total} sessions are busy with calls; try again when one finishes",
                code=INTERNAL_ERROR,
            )
            return
        with self.shares.opening_for(client) as done:
            await self._forward(scope, receive, send, body, opened=done)

    def _too_big(self) -> str:
        return f"the request body is larger than {self.max_body_bytes} bytes, the most this server reads"

    async def _read_body(self, receive: Any, send: Any) -> bytes | None:
        """The whole body, or None after answering 408/413 (or when the client went away)."""
        import anyio

        chunks: list[bytes] = []
        size = 0
        with anyio.move_on_after(self.body_timeout_s) as reading:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body_bytes:
                    await refuse(send, 413, self._too_big())
                    return None
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        if reading.cancelled_caught:
            await refuse(send, 408, f"the request body did not arrive within {self.body_timeout_s:g} s")
            return None
        return b"".join(chunks)

    async def _forward(
        self, scope: Any, receive: Any, send: Any, body: bytes, opened: Callable[[str], None] | None = None
    ) -> None:
        import anyio

        ids = request_ids(body)
        state = {"delivered": False, "answered": False, "cancelled": False}

        async def replay() -> Any:
            if not state["delivered"]:
                state["delivered"] = True
                return {"type": "http.request", "body": body, "more_body": False}
            message = await receive()  # the next message is the client going away
            if (
                message["type"] == "http.disconnect"
                and ids
                and not state["answered"]
                and not state["cancelled"]
            ):
                state["cancelled"] = True
                with anyio.CancelScope(shield=True):
                    await self._cancel(scope, ids)
            return message

        async def tracked_send(message: Any) -> None:
            if message["type"] == "http.response.start" and opened is not None:
                new = dict(message.get("headers") or []).get(SESSION_HEADER)
                if new and message.get("status", 200) < 400:
                    opened(new.decode("latin-1"))
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                state["answered"] = True
            await send(message)

        await self.app(scope, replay, tracked_send)

    async def _cancel(self, scope: Any, ids: list[Any]) -> None:
        for request_id in ids:
            note = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": {"requestId": request_id, "reason": "the client disconnected"},
                }
            ).encode()
            headers = [(k, v) for k, v in scope.get("headers", []) if k != b"content-length"]
            headers.append((b"content-length", str(len(note)).encode()))
            sent = False

            async def once(note: bytes = note) -> Any:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": note, "more_body": False}
                return {"type": "http.disconnect"}

            async def discard(_: Any) -> None:
                return None

            try:
                await self.app({**scope, "headers": headers}, once, discard)
            except Exception:  # noqa: BLE001 - best effort: the session may be gone already
                pass

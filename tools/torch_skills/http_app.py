"""Serving the MCP server over streamable HTTP, with the limits a server that runs code needs.

Use it from the command line (`torch-skills --transport http [--host H --token T --allowed-origin O]`)
or in code:

    settings = HttpSettings.from_args(host="0.0.0.0", port=8765, token=os.environ["TORCH_SKILLS_TOKEN"])
    serve_http(build_server(), settings)           # blocks; HttpConfigError if the settings are unsafe

What it enforces:
- Bound beyond loopback, every request needs `Authorization: Bearer <token>` (`--token` or the
  TORCH_SKILLS_TOKEN environment variable); without a token it refuses to start. On loopback a
  token is optional (checked when given).
- Host and Origin are checked (the SDK's DNS-rebinding protection): loopback names always, the
  bound host, `--allowed-host` values and the hosts of `--allowed-origin` values; browsers'
  Origin must be a loopback origin or one given with `--allowed-origin`.
- A request's headers must arrive within HEADER_TIMEOUT_S of its first byte, its body within
  BODY_TIMEOUT_S (a slow client cannot hold a connection open); bodies are capped by the SDK (4 MiB).
- Sessions that stay idle SESSION_IDLE_S are closed, at most MAX_SESSIONS live at once, and a
  client that drops its connection mid-call has the call cancelled (its worker process killed).

Known limitations: no TLS here (put a reverse proxy in front for that); the token is a shared
secret, not per-user identity.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

HEADER_TIMEOUT_S = 10.0  # seconds for a request's headers, from its first byte
BODY_TIMEOUT_S = 30.0  # seconds for a request's whole body once its headers are in
SESSION_IDLE_S = 300.0  # an MCP session without any request for this long is closed
MAX_SESSIONS = 64  # live MCP sessions at once; more get 503 until one ends
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this long
TOKEN_ENV = "TORCH_SKILLS_TOKEN"

_LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", "[::1]"]
_LOOPBACK_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]


class HttpConfigError(ValueError):
    """Settings that would expose the tools: say what to add."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class HttpSettings:
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    session_idle_s: float = SESSION_IDLE_S
    max_sessions: int = MAX_SESSIONS
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_args(
        cls,
        host: str,
        port: int,
        token: str | None = None,
        allowed_origins: list[str] | tuple[str, ...] = (),
        allowed_hosts: list[str] | tuple[str, ...] = (),
    ) -> HttpSettings:
        """Settings from the command line; the token falls back to $TORCH_SKILLS_TOKEN."""
        token = token or os.environ.get(TOKEN_ENV) or None
        settings = cls(host, port, token, tuple(allowed_origins), tuple(allowed_hosts))
        settings.validate()
        return settings

    def validate(self) -> None:
        """Raise HttpConfigError for settings that would serve code-running tools to the network."""
        if not is_loopback(self.host) and not self.token:
            raise HttpConfigError(
                f"--host {self.host} serves tools that run code to other machines; it needs a bearer token. "
                f"Pass --token SECRET or set {TOKEN_ENV} (clients send 'Authorization: Bearer SECRET'), "
                "or bind 127.0.0.1."
            )
        if self.token is not None and len(self.token) < 16:
            raise HttpConfigError("the HTTP token must be at least 16 characters; use a random one")
        for origin in self.allowed_origins:
            parsed = urlparse(origin)
            if parsed.scheme not in ("http", "https") or not parsed.netloc or origin == "*":
                raise HttpConfigError(
                    f"--allowed-origin {origin!r} must be a full origin such as https://app.example.com"
                )

    def security(self) -> Any:
        """The SDK's TransportSecuritySettings: Host and Origin checks always on."""
        from mcp.server.transport_security import TransportSecuritySettings

        hosts = list(_LOOPBACK_HOSTS)
        if not is_loopback(self.host):
            names = {self.host} if self.host not in ("0.0.0.0", "::", "") else set()
            names |= {socket.gethostname(), socket.getfqdn()}
            for name in names:
                hosts += [name, f"{name}:*"]
        for origin in self.allowed_origins:
            netloc = urlparse(origin).netloc
            hosts += [netloc, f"{netloc.split(':')[0]}:*"]
        for host in self.allowed_hosts:
            hosts += [host, f"{host}:*"]
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=hosts,
            allowed_origins=[*_LOOPBACK_ORIGINS, *self.allowed_origins],
        )


# -- ASGI middleware ----------------------------------------------------------------------------
async def _plain(send: Any, status: int, text: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), *headers],
        }
    )
    await send({"type": "http.response.body", "body": text.encode()})


class BearerToken:
    """Refuse every HTTP request without `Authorization: Bearer <token>` (401)."""

    def __init__(self, app: Any, token: str):
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await _plain(
                    send,
                    401,
                    "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                    [(b"www-authenticate", b'Bearer realm="torch-skills"')],
                )
                return
        await self.app(scope, receive, send)


def _request_ids(body: bytes) -> list[Any]:
    """The ids of the JSON-RPC requests in a POST body (one message or a batch); [] if none."""
    try:
        data = json.loads(body)
    except ValueError:
        return []
    messages = data if isinstance(data, list) else [data]
    return [m["id"] for m in messages if isinstance(m, dict) and "method" in m and m.get("id") is not None]


class RequestGuard:
    """Read a request's whole body within `timeout_s` (else 408), then hand it to the app; when the
    client drops the connection before its answer, cancel the requests it carried.

    The cancellation is the protocol's own: a `notifications/cancelled` for each request id, sent
    into the same session, so the call's handler is cancelled and its worker process killed."""

    def __init__(self, app: Any, timeout_s: float):
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        import anyio

        chunks: list[bytes] = []
        with anyio.move_on_after(self.timeout_s) as reading:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        if reading.cancelled_caught:
            await _plain(send, 408, f"the request body did not arrive within {self.timeout_s:g} s")
            return
        body = b"".join(chunks)
        ids = _request_ids(body)
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


def _header_timeout_protocol(timeout_s: float) -> type:
    """uvicorn's h11 protocol, closing a connection whose request headers take over `timeout_s`."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutH11(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            idle = self.cycle is None or self.cycle.response_complete
            if idle:
                self._arm()  # a new request starts: its headers have timeout_s to arrive
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # headers are in; the body has RequestGuard's timeout

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeoutH11


def build_app(mcp: Any, settings: HttpSettings) -> Any:
    """The ASGI app: the SDK's streamable-HTTP app inside the token and body-timeout layers."""
    app = mcp.streamable_http_app(
        transport_security=settings.security(),
        session_idle_timeout=settings.session_idle_s,
        max_sessions=settings.max_sessions,
        host=settings.host,
    )
    wrapped: Any = RequestGuard(app, settings.body_timeout_s)
    if settings.token:
        wrapped = BearerToken(wrapped, settings.token)
    return wrapped


def serve_http(mcp: Any, settings: HttpSettings) -> None:
    """Run the server over streamable HTTP until interrupted (validates the settings first)."""
    import anyio
    import uvicorn

    settings.validate()
    config = uvicorn.Config(
        build_app(mcp, settings),
        host=settings.host,
        port=settings.port,
        http=_header_timeout_protocol(settings.header_timeout_s),
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=5,
        h11_max_incomplete_event_size=64 * 1024,  # headers larger than 64 KiB are refused
        limit_concurrency=256,
        lifespan="on",
        log_level="warning",
    )
    anyio.run(uvicorn.Server(config).serve)

"""Serving the MCP server over streamable HTTP, with the limits a server that runs code needs.

Use it from the command line (`torch-skills --transport http [--host H --token T --allowed-origin O]`)
or in code:

    settings = HttpSettings.from_args(host="0.0.0.0", port=8765, token=os.environ["TORCH_SKILLS_TOKEN"])
    serve_http(build_server(), settings)           # blocks; HttpConfigError if the settings are unsafe

What it enforces, in this order and before any byte of a request body is read:
- Host and Origin are checked (DNS-rebinding protection): loopback names always, the bound host,
  `--allowed-host` values and the hosts of `--allowed-origin` values; a browser's Origin must be
  a loopback origin or one given with `--allowed-origin`. A POST must say `Content-Type:
  application/json` (a cross-origin `text/plain` form post is refused without being read).
- Every request needs `Authorization: Bearer <token>`, on loopback too. The token is `--token` or
  $TORCH_SKILLS_TOKEN; without either, one is generated at start, written to a file only the user
  can read (`token_file_paths`: $XDG_RUNTIME_DIR/torch-skills/ or ~/.cache/torch-skills/) and
  printed on stderr with the URL. Bound beyond loopback, the token must be given explicitly.
- A body larger than MAX_BODY_BYTES is refused from its Content-Length, or once that many bytes
  arrived without one; a request's headers must arrive within HEADER_TIMEOUT_S of its first byte,
  its body within BODY_TIMEOUT_S; an idle keep-alive connection is closed after KEEP_ALIVE_S.
- Sessions that stay idle SESSION_IDLE_S are closed; at most MAX_SESSIONS live at once (when all
  are open, a new one replaces the longest-unused session with no call running; 503 only when
  every session is busy) and MAX_SESSIONS_PER_CLIENT per client address; a client that drops its connection mid-call has
  the call cancelled (its worker process killed).
- Every refusal is a JSON-RPC error body (id null) with the HTTP status that fits; a body that is
  not JSON, or nests too deep, gets the SDK's JSON-RPC parse error.

Known limitations: no TLS here (put a reverse proxy in front for that); the token is a shared
secret, not per-user identity; "per client" means per remote address, so on loopback every local
process counts as one client (the token is what keeps other local users out).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import os
import resource
import secrets
import socket
import sys
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

HEADER_TIMEOUT_S = 5.0  # seconds for a request's headers, from its first byte (half-open connections)
BODY_TIMEOUT_S = 30.0  # seconds for a request's whole body once its headers are in
SESSION_IDLE_S = 300.0  # an MCP session without any request for this long is closed
MAX_SESSIONS = 64  # live MCP sessions at once; a new one then replaces the longest-unused idle one
MAX_SESSIONS_PER_CLIENT = 32  # live sessions one client address may hold (half: one cannot take them all)
MAX_BODY_BYTES = 4 * 1024 * 1024  # the largest request body (the SDK's own default cap)
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this long
MAX_CONNECTIONS = 1000  # open connections at once (uvicorn answers 503 past it); kept below RLIMIT_NOFILE
TOKEN_ENV = "TORCH_SKILLS_TOKEN"
MCP_PATH = "/mcp"

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
    max_sessions_per_client: int = MAX_SESSIONS_PER_CLIENT
    max_body_bytes: int = MAX_BODY_BYTES
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
        """Settings from the command line; the token falls back to $TORCH_SKILLS_TOKEN (and, on
        loopback, to one `serve_http` generates)."""
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


def token_file_paths(port: int) -> list[Path]:
    """Where a generated token is written, first choice first: $XDG_RUNTIME_DIR/torch-skills/ (a
    per-user folder the system clears at logout) when there is one, then ~/.cache/torch-skills/;
    one file per port, so servers on different ports do not overwrite each other's token."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    bases = [Path(runtime)] if runtime and Path(runtime).is_dir() else []
    bases.append(Path.home() / ".cache")
    return [base / "torch-skills" / f"http-token-{port}" for base in bases]


def write_token_file(path: Path, token: str) -> None:
    """Write `token` to `path`, readable and writable by the user only (folder 0700, file 0600)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a file left by an earlier run may have other bits
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)


def ensure_token(settings: HttpSettings) -> tuple[HttpSettings, Path | None]:
    """`settings` with a token: the given one, or a new random one written to the first writable
    of `token_file_paths` (returned with it). Beyond loopback the token must be given (validate()
    says so)."""
    settings.validate()
    if settings.token:
        return settings, None
    token = secrets.token_urlsafe(32)
    problems = []
    for path in token_file_paths(settings.port):
        try:
            write_token_file(path, token)
            return dataclasses.replace(settings, token=token), path
        except OSError as e:
            problems.append(f"{path}: {e.strerror or e}")
    raise HttpConfigError(
        f"could not write the generated HTTP token ({'; '.join(problems)}); pass --token SECRET or set "
        f"{TOKEN_ENV} instead"
    )


def start_banner(settings: HttpSettings, token_file: Path | None) -> str:
    """What the server prints at start: the URL, how to send the token and where it is."""
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    lines = [
        f"torch-skills: MCP over streamable HTTP at http://{host}:{settings.port}{MCP_PATH}",
        "torch-skills: every request needs the header 'Authorization: Bearer <token>'",
    ]
    if token_file is not None:
        lines += [
            f"torch-skills: token (generated for this run): {settings.token}",
            f"torch-skills: also written to {token_file} (readable only by you)",
        ]
    else:
        lines.append(f"torch-skills: token: the one given with --token or ${TOKEN_ENV}")
    return "\n".join(lines) + "\n"


# -- uvicorn ------------------------------------------------------------------------------------
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
    """The ASGI app: the SDK's streamable-HTTP app behind `HttpGate` (needs `settings.token`)."""
    from torch_skills.http_gate import HttpGate

    if not settings.token:
        raise HttpConfigError("build_app needs a token: pass settings through ensure_token() first")
    app = mcp.streamable_http_app(
        streamable_http_path=MCP_PATH,
        transport_security=settings.security(),
        session_idle_timeout=settings.session_idle_s,
        max_sessions=settings.max_sessions,
        max_request_body_size=settings.max_body_bytes,
        host=settings.host,
    )

    def live_sessions() -> Container[str] | None:
        # The SDK keeps its open sessions here (no public accessor in mcp 2.3); None if that changes.
        return getattr(mcp.session_manager, "_server_instances", None)

    def evict(session_id: str) -> bool:
        """End a session the way its idle timeout does (the SDK then forgets it and answers 404)."""
        transport = (live_sessions() or {}).get(session_id)  # type: ignore[union-attr]
        idle_scope = getattr(transport, "idle_scope", None)
        if idle_scope is None:
            return False
        idle_scope.cancel()
        return True

    return HttpGate(
        app,
        token=settings.token,
        security=settings.security(),
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
        max_sessions=settings.max_sessions,
        max_sessions_per_client=settings.max_sessions_per_client,
        session_idle_s=settings.session_idle_s,
        live_sessions=live_sessions,
        evict=evict,
        path=MCP_PATH,
    )


def _max_connections() -> int:
    """MAX_CONNECTIONS, lowered to leave file descriptors for the server itself where the limit is low."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, soft - 128))


def serve_http(mcp: Any, settings: HttpSettings) -> None:
    """Run the server over streamable HTTP until interrupted (validates the settings first; without a
    token, generates one, writes it to the first of `token_file_paths` it can and prints it with the URL on stderr)."""
    import anyio
    import uvicorn

    settings, token_file = ensure_token(settings)
    config = uvicorn.Config(
        build_app(mcp, settings),
        host=settings.host,
        port=settings.port,
        http=_header_timeout_protocol(settings.header_timeout_s),
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=5,
        h11_max_incomplete_event_size=64 * 1024,  # headers larger than 64 KiB are refused
        limit_concurrency=_max_connections(),
        lifespan="on",
        log_level="warning",
    )
    sys.stderr.write(start_banner(settings, token_file))
    sys.stderr.flush()
    anyio.run(uvicorn.Server(config).serve)

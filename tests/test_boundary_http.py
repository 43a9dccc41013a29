"""Abuse matrix, HTTP: a token beyond loopback, Host/Origin checks, slow clients cut off, dropped
clients' calls cancelled, sessions that expire and are capped."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.raw_jsonrpc import INITIALIZE
from torch_skills.http_app import HttpConfigError, HttpSettings

# Each module starts real server processes (stdio or HTTP): tens of seconds, so the slow CI step.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TOKEN = "t0ken-for-the-tests-only-0123456789"
SERVE = """
import sys
sys.path.insert(0, {repo!r}); import server
from torch_skills.http_app import HttpSettings, serve_http
from torch_skills.server import build_server
serve_http(build_server(allow=[{project!r}], max_jobs=2), HttpSettings(port={port}, token={token!r},
           header_timeout_s=1.0, body_timeout_s=1.0, session_idle_s=3.0, max_sessions=3))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("http")
    (root / "hang.py").write_text(
        "import os, time, torch\n\ndef build():\n"
        f"    open({str(root / 'pid')!r}, 'w').write(str(os.getpid()))\n"
        "    while True:\n        time.sleep(0.05)\n"
    )
    return root


@pytest.fixture(scope="module")
def server(project: Path) -> Iterator[str]:
    port = _free_port()
    code = SERVE.format(repo=str(REPO), project=str(project), port=port, token=TOKEN)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
        assert time.monotonic() < deadline and proc.poll() is None, "the HTTP server did not start"
        time.sleep(0.1)
    yield f"127.0.0.1:{port}"
    proc.kill()
    proc.wait(timeout=10)


def _headers(**extra: str) -> dict[str, str]:
    return {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "authorization": f"Bearer {TOKEN}",
        **extra,
    }


def _session(http, url: str) -> dict[str, str]:
    init = http.post(url, headers=_headers(), json=INITIALIZE)
    assert init.status_code == 200, init.content
    headers = _headers(
        **{"mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
    )
    http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    return headers


def test_binding_beyond_loopback_without_a_token_is_refused(monkeypatch):
    """--host 0.0.0.0 with no token (flag or environment) refuses to start and says how to fix it."""
    monkeypatch.delenv("TORCH_SKILLS_TOKEN", raising=False)
    with pytest.raises(HttpConfigError) as err:
        HttpSettings.from_args("0.0.0.0", 8765)
    assert "--token" in str(err.value) and "TORCH_SKILLS_TOKEN" in str(err.value)
    monkeypatch.setenv("TORCH_SKILLS_TOKEN", TOKEN)
    assert HttpSettings.from_args("0.0.0.0", 8765).token == TOKEN
    out = subprocess.run(
        [sys.executable, "server.py", "--transport", "http", "--host", "0.0.0.0", "--no-prewarm"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "TORCH_SKILLS_TOKEN"},
    )
    assert out.returncode == 2 and "--token" in out.stderr


def test_allowed_origins_must_be_real_origins():
    """A wildcard or a bare host is not an origin: refused at start-up."""
    for origin in ("*", "example.com", "ftp://x"):
        with pytest.raises(HttpConfigError):
            HttpSettings.from_args("127.0.0.1", 8765, allowed_origins=[origin])


def test_requests_without_the_token_get_401_and_with_it_are_served(server: str):
    """Every request needs the bearer token once one is set."""
    import httpx2 as httpx

    url = f"http://{server}/mcp"
    with httpx.Client(timeout=30) as http:
        for auth in ({}, {"authorization": "Bearer wrong"}):
            headers = {k: v for k, v in _headers().items() if k != "authorization"} | auth
            assert http.post(url, headers=headers, json=INITIALIZE).status_code == 401
        assert http.post(url, headers=_headers(), json=INITIALIZE).status_code == 200


def test_foreign_host_and_origin_headers_are_refused(server: str):
    """DNS rebinding protection stays on: a foreign Host gets 421, a foreign Origin 403."""
    import httpx2 as httpx

    url = f"http://{server}/mcp"
    with httpx.Client(timeout=30) as http:
        assert http.post(url, headers=_headers(host="evil.example:80"), json=INITIALIZE).status_code == 421
        assert (
            http.post(url, headers=_headers(origin="http://evil.example"), json=INITIALIZE).status_code == 403
        )


def test_slow_headers_and_slow_bodies_are_cut_off(server: str):
    """A client that dribbles its headers or body does not hold the connection."""
    host, port = server.split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /mcp HTTP/1.1\r\nhost: " + server.encode() + b"\r\n")  # headers never finish
        s.settimeout(10)
        started = time.monotonic()
        assert s.recv(1024) == b"" and time.monotonic() - started < 5  # closed by the server
    with socket.create_connection((host, int(port))) as s:
        head = "".join(f"{k}: {v}\r\n" for k, v in _headers().items())
        s.sendall(f"POST /mcp HTTP/1.1\r\nhost: {server}\r\n{head}content-length: 500\r\n\r\n{{".encode())
        s.settimeout(10)
        assert b" 408 " in s.recv(1024).split(b"\r\n")[0] + b" "


def test_a_dropped_connection_cancels_its_call_and_kills_the_job(server: str, project: Path):
    """The client goes away mid-call: the job's process is killed, not left running to its timeout."""
    import httpx2 as httpx

    url = f"http://{server}/mcp"
    with httpx.Client(timeout=30) as http:
        headers = _session(http, url)
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {
            "name": "check_gradients",
            "arguments": {"model": f"{project / 'hang.py'}:build", "input_shape": [2, 2], "timeout_s": 300},
        },
    }
    body = json.dumps(call).encode()
    host, port = server.split(":")
    pid_file = project / "pid"
    s = socket.create_connection((host, int(port)))
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    s.sendall(
        f"POST /mcp HTTP/1.1\r\nhost: {server}\r\n{head}content-length: {len(body)}\r\n\r\n".encode() + body
    )
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.1)
    pid = int(pid_file.read_text())
    s.close()
    deadline = time.monotonic() + 15
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}")


def test_sessions_are_capped_and_idle_ones_expire(server: str):
    """Past max_sessions a new session gets 503; an idle session is gone after session_idle_s."""
    import httpx2 as httpx

    url = f"http://{server}/mcp"
    time.sleep(3.5)  # let the sessions of earlier tests expire
    with httpx.Client(timeout=30) as http:
        sessions = [_session(http, url) for _ in range(3)]
        assert http.post(url, headers=_headers(), json=INITIALIZE).status_code == 503
        time.sleep(4.5)
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        assert http.post(url, headers=sessions[0], json=ping).status_code == 404
        assert http.post(url, headers=_headers(), json=INITIALIZE).status_code == 200

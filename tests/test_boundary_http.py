"""Abuse matrix, HTTP: a token always (generated when not given), Host/Origin/Content-Type and size
checks before any body is read, slow and half-open clients cut off, malformed requests answered
with JSON-RPC errors, dropped clients' calls cancelled, sessions that expire and are capped per
client and in total."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.http_client import TEST_TOKEN
from tests.raw_jsonrpc import INITIALIZE
from torch_skills.http_app import HttpConfigError, HttpSettings

# Each module starts real server processes (stdio or HTTP): tens of seconds, so the slow CI step.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TOKEN = TEST_TOKEN
SERVE = """
import sys
sys.path.insert(0, {repo!r}); import server
from torch_skills.http_app import HttpSettings, serve_http
from torch_skills.server import build_server
serve_http(build_server(allow=[{project!r}], max_jobs=2), HttpSettings(port={port}, token={token!r},
           header_timeout_s=1.0, body_timeout_s=1.0, session_idle_s=3.0, max_sessions={sessions},
           max_sessions_per_client={per_client}))
"""
PIDS: dict[str, int] = {}  # server address -> its process id, for RSS checks


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


@contextlib.contextmanager
def _serving(project: Path, sessions: int, per_client: int) -> Iterator[str]:
    """A server process with the short test limits; yields its 'host:port'."""
    port = _free_port()
    code = SERVE.format(
        repo=str(REPO), project=str(project), port=port, token=TOKEN, sessions=sessions, per_client=per_client
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline and proc.poll() is None, "the HTTP server did not start"
            time.sleep(0.1)
        PIDS[f"127.0.0.1:{port}"] = proc.pid
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server(project: Path) -> Iterator[str]:
    """The server most tests share (room for the sessions they open)."""
    with _serving(project, sessions=16, per_client=12) as address:
        yield address


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


def _from(address: str):
    """An httpx client whose connections come from `address` (another loopback address: another client)."""
    import httpx2 as httpx

    return httpx.Client(timeout=30, transport=httpx.HTTPTransport(local_address=address))


def test_sessions_are_capped_per_client_and_a_full_server_makes_room_for_a_new_client(project: Path):
    """One client gets at most its share; when all are open, the longest-idle session makes room."""
    with _serving(project, sessions=4, per_client=3) as server:
        _check_session_limits(f"http://{server}/mcp")


def _check_session_limits(url: str) -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    with _from("127.0.0.1") as a, _from("127.0.0.2") as b, _from("127.0.0.3") as c:
        mine = [_session(a, url) for _ in range(3)]
        refused = a.post(url, headers=_headers(), json=INITIALIZE)
        assert refused.status_code == 503 and "sessions" in refused.json()["error"]["message"]
        _session(b, url)  # another client still gets in: 4 of 4 open
        assert a.post(url, headers=mine[1], json=ping).status_code == 200
        _session(c, url)  # full: a's first session, unused for longest, makes room
        assert a.post(url, headers=mine[0], json=ping).status_code == 404
        assert a.post(url, headers=mine[1], json=ping).status_code == 200
        time.sleep(4.5)
        assert a.post(url, headers=mine[1], json=ping).status_code == 404  # idle past session_idle_s
        assert a.post(url, headers=_headers(), json=INITIALIZE).status_code == 200


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _send_body(s: socket.socket, total: int, chunked: bool = False) -> int:
    """Send up to `total` bytes of body until the server stops reading or closes; return what was sent."""
    block, sent = b"x" * (1 << 20), 0
    framed = b"%x\r\n%s\r\n" % (len(block), block) if chunked else block
    s.settimeout(5)
    try:
        while sent < total:
            s.sendall(framed)
            sent += len(block)
    except OSError:
        pass
    return sent


def _status(s: socket.socket) -> int:
    s.settimeout(10)
    head = s.recv(4096)
    return int(head.split(b" ", 2)[1])


def test_a_300_mib_body_is_refused_before_it_is_read_and_the_server_stays_small(server: str):
    """Declared or not, an oversized body is refused after at most the cap: server RSS stays flat."""
    host, port = server.split(":")
    before = _rss(PIDS[server])
    auth = f"authorization: Bearer {TOKEN}\r\n"
    declared = (
        f"POST /mcp HTTP/1.1\r\nhost: {server}\r\n{auth}content-type: application/json\r\n"
        f"accept: application/json, text/event-stream\r\ncontent-length: {300 << 20}\r\n\r\n"
    )
    with socket.create_connection((host, int(port))) as s:
        s.sendall(declared.encode())
        assert _status(s) == 413  # from the Content-Length alone, before a byte of body
    chunked = declared.replace(f"content-length: {300 << 20}", "transfer-encoding: chunked")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(chunked.encode())
        sent = _send_body(s, 300 << 20, chunked=True)
        assert _status(s) == 413
    assert sent < 300 << 20  # the server closed the connection instead of reading it all
    assert _rss(PIDS[server]) - before < 32 << 20


def test_a_cross_origin_text_plain_post_is_refused_without_reading_its_body(server: str):
    """A browser's form post (foreign Origin, text/plain, no token) never gets its body read."""
    host, port = server.split(":")
    head = (
        f"POST /mcp HTTP/1.1\r\nhost: {server}\r\norigin: http://evil.example\r\n"
        f"content-type: text/plain\r\ncontent-length: {300 << 20}\r\n\r\n"
    )
    with socket.create_connection((host, int(port))) as s:
        s.sendall(head.encode())
        assert _status(s) in (400, 403)
        assert _send_body(s, 300 << 20) < 300 << 20


def test_half_open_connections_are_closed_within_seconds_and_do_not_lock_out_clients(server: str):
    """300 connections that send nothing: a real client is still served, and they are all cut off."""
    import httpx2 as httpx

    host, port = server.split(":")
    idle = [socket.create_connection((host, int(port))) for _ in range(300)]
    try:
        with httpx.Client(timeout=30) as http:
            assert http.post(f"http://{server}/mcp", headers=_headers(), json=INITIALIZE).status_code == 200
        deadline = time.monotonic() + 5
        for s in idle:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            assert s.recv(1) == b""  # closed by the server (header_timeout_s=1)
    finally:
        for s in idle:
            s.close()


def test_malformed_requests_get_json_rpc_error_replies(server: str):
    """Invalid JSON, 100,000-deep nesting and a NUL in the URL path each get a JSON-RPC error."""
    import httpx2 as httpx

    with httpx.Client(timeout=30) as http:
        for url, body in (
            (f"http://{server}/mcp", b"{not json"),
            (f"http://{server}/mcp", b"[" * 100_000 + b"]" * 100_000),
            (f"http://{server}/mcp%00", json.dumps(INITIALIZE).encode()),
        ):
            answer = http.post(url, headers=_headers(), content=body)
            assert 400 <= answer.status_code < 500, answer.content
            error = answer.json()
            assert error["jsonrpc"] == "2.0" and error["id"] is None and error["error"]["message"]
        headers = _session(http, f"http://{server}/mcp")
        call = {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {
                "name": "get_skill",
                "arguments": {"name": "debugging-techniques", "path": "SKILL\x00.md"},
            },
        }
        answer = http.post(f"http://{server}/mcp", headers=headers, json=call)
        data = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
        result = next(d for d in data if d.get("id") == 3)["result"]
        assert result["isError"] and "no skill file name has" in result["content"][0]["text"]


def test_without_a_token_the_server_makes_one_writes_it_for_the_user_only_and_prints_it(tmp_path: Path):
    """On loopback with no --token: a random token, a 0600 file, the URL and token on stderr, 401 without it."""
    import httpx2 as httpx

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "TORCH_SKILLS_TOKEN"}
    env.update(XDG_RUNTIME_DIR=str(tmp_path), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "server.py", "--transport", "http", "--port", str(port), "--no-prewarm"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stderr is not None
        raw, deadline = b"", time.monotonic() + 60
        while raw.count(b"\n") < 4:  # a missing banner fails the test, never hangs it
            ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(proc.stderr.fileno(), 4096) if ready else b""
            assert chunk, f"no start banner on stderr; got {raw!r}"
            raw += chunk
        banner = raw.decode().splitlines()
        token_file = tmp_path / "torch-skills" / f"http-token-{port}"
        token = token_file.read_text().strip()
        assert f"http://127.0.0.1:{port}/mcp" in banner[0] and "Authorization: Bearer" in banner[1]
        assert token in banner[2] and str(token_file) in banner[3] and len(token) >= 32
        assert token_file.stat().st_mode & 0o777 == 0o600 and token_file.parent.stat().st_mode & 0o077 == 0
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline and proc.poll() is None, "the HTTP server did not start"
            time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/mcp"
        plain = {k: v for k, v in _headers().items() if k != "authorization"}
        with httpx.Client(timeout=30) as http:
            assert http.post(url, headers=plain, json=INITIALIZE).status_code == 401
            given = plain | {"authorization": f"Bearer {token}"}
            assert http.post(url, headers=given, json=INITIALIZE).status_code == 200
    finally:
        proc.kill()
        proc.wait(timeout=10)

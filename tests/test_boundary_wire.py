"""Abuse matrix, the wire: bytes that are not UTF-8 never reach a client, over stdio or HTTP.

The requests are written by hand (raw JSON lines, raw HTTP) and the answers checked byte by byte.
The non-UTF-8 bytes come from the user's side: file names in a folder, an exception message and
printed output. (A request carrying a "\\udc80" escape is rejected by the SDK's JSON parser before
it reaches the server's code.) Each test then checks the server still answers.
"""

from __future__ import annotations

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

# Each module starts real server processes (stdio or HTTP): tens of seconds, so the slow CI step.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BAD = b"caf\xe9-\xff"  # Latin-1 bytes: not UTF-8


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files with non-UTF-8 names, an exception message and output that are not UTF-8."""
    root = tmp_path_factory.mktemp("wire")
    folder = root / "models"
    folder.mkdir()
    (Path(os.fsdecode(bytes(folder) + b"/" + BAD + b".py"))).write_text("x = 1\n")
    (folder / "raises.py").write_text(
        "import os, sys, torch\n\ndef build():\n"
        f"    sys.stdout.buffer.write({BAD!r} + b'\\n'); sys.stdout.flush()\n"
        f"    raise ValueError(os.fsdecode({BAD!r}))\n"
    )
    return root


def _call(i: int, tool: str, arguments: dict) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": i,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


def _requests(project: Path) -> list[dict]:
    folder = project / "models"
    return [
        _call(1, "check_gradients", {"model": f"{folder / 'missing.py'}:build", "input_shape": [2, 4]}),
        _call(2, "check_gradients", {"model": f"{folder / 'raises.py'}:build", "input_shape": [2, 4]}),
        _call(5, "route", {"query": "CUDA out of memory"}),
    ]


def _check_answers(raw: dict[int, bytes]) -> None:
    for i, data in raw.items():
        data.decode("utf-8")  # strict: every byte the server sent is UTF-8
        message = json.loads(data)
        assert "\\udc" not in data.decode() and all(not (0xD800 <= ord(c) <= 0xDFFF) for c in data.decode())
        assert message.get("id") == i
    texts = {
        i: json.loads(d)["result"]["content"][0]["text"] for i, d in raw.items() if "result" in json.loads(d)
    }
    assert "\ufffd" in texts[1] and ".py" in texts[1]  # the folder's file names were listed, made safe
    assert "ValueError" in texts[2] and "\ufffd" in texts[2]  # the exception and the output, made safe
    assert json.loads(raw[5])["result"]["structuredContent"]["skills"]  # still answering afterwards


@pytest.fixture(scope="module")
def stdio_server(project: Path) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "server.py"), "--allow", str(project)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def test_stdio_answers_stay_utf8_with_non_utf8_names_messages_and_output(stdio_server, project: Path):
    """Over stdio every answer is strict UTF-8 JSON and the server keeps answering."""
    assert stdio_server.stdin is not None and stdio_server.stdout is not None

    def send(message: dict) -> None:
        stdio_server.stdin.write(json.dumps(message).encode() + b"\n")  # ensure_ascii: "\udc80" escapes
        stdio_server.stdin.flush()

    send(INITIALIZE)
    assert json.loads(stdio_server.stdout.readline())["id"] == 0
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    raw: dict[int, bytes] = {}
    for request in _requests(project):
        send(request)
        while True:  # skip notifications (progress, logs)
            ready, _, _ = select.select([stdio_server.stdout], [], [], 120)
            assert ready, f"no answer to request {request['id']} within 120 s"
            line = stdio_server.stdout.readline()
            assert line, "the server stopped answering"
            if json.loads(line).get("id") == request["id"]:
                raw[request["id"]] = line
                break
    _check_answers(raw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_answers_stay_utf8_with_non_utf8_names_messages_and_output(project: Path):
    """Over streamable HTTP every body is strict UTF-8 JSON and the session keeps answering."""
    import httpx2 as httpx

    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "server.py"),
            "--transport",
            "http",
            "--port",
            str(port),
            "--allow",
            str(project),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TORCH_SKILLS_TOKEN": TEST_TOKEN},
    )
    try:
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline, "the HTTP server did not start"
            time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/mcp"
        headers = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "authorization": f"Bearer {TEST_TOKEN}",
        }
        with httpx.Client(timeout=120) as http:
            init = http.post(url, headers=headers, json=INITIALIZE)
            headers |= {
                "mcp-session-id": init.headers["mcp-session-id"],
                "mcp-protocol-version": "2025-06-18",
            }
            http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
            raw: dict[int, bytes] = {}
            for request in _requests(project):
                body = json.dumps(request).encode()
                answer = http.post(url, headers=headers, content=body)
                assert answer.status_code == 200, answer.content
                for line in answer.content.splitlines():  # SSE: the last data line is the answer
                    if line.startswith(b"data: ") and b'"id"' in line:
                        raw[request["id"]] = line[len(b"data: ") :]
        _check_answers(raw)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_stdio_answers_malformed_lines_with_json_rpc_errors_and_keeps_serving():
    """A line that is not JSON, nests 100,000 deep, or is not JSON-RPC gets an error reply, not silence."""
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "server.py"), "--no-prewarm"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None

    def exchange(line: bytes) -> dict:
        proc.stdin.write(line + b"\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, f"no answer to {line[:40]!r} within 60 s"
        return json.loads(proc.stdout.readline())

    try:
        assert exchange(json.dumps(INITIALIZE).encode())["id"] == 0
        for line, code, request_id in (
            (b"{not json", -32700, None),
            (b"[" * 100_000 + b"]" * 100_000, -32700, None),
            (b'{"jsonrpc": "2.0", "id": 9, "method": 3}', -32600, 9),
        ):
            answer = exchange(line)
            assert answer["error"]["code"] == code and answer["id"] == request_id, answer
        assert exchange(b'{"jsonrpc": "2.0", "id": 10, "method": "ping"}') == {
            "jsonrpc": "2.0",
            "id": 10,
            "result": {},
        }
    finally:
        proc.kill()
        proc.wait(timeout=10)

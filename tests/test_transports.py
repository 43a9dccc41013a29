"""The real transports: stdio in a subprocess, streamable HTTP on loopback, and a fast start."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.http_client import TEST_TOKEN, http_client

REPO = Path(__file__).resolve().parents[1]


def _stdio_params(*args: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(REPO / "server.py"), *args], cwd=str(REPO))


def test_building_the_server_does_not_import_torch():
    """Start-up stays fast: torch is imported only in the worker processes."""
    code = (
        "import sys, json; sys.path.insert(0, '.'); import server; from torch_skills.server import build_server; build_server(); "
        "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


async def test_the_stdio_server_lists_reads_and_routes():
    """A client over real stdio lists tools, reads a skill and routes a query."""
    async with Client(_stdio_params("--no-prewarm")) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert {"list_skills", "get_skill", "route"} <= names
        read = await c.read_resource("skill://using-pytorch-engineering/SKILL.md")
        assert read.contents[0].text.startswith("---\nname: using-pytorch-engineering")
        routed = await c.call_tool("route", {"query": "NCCL timeout on 8 nodes"})
        assert routed.structured_content["skills"][0] == "distributed-training-strategies"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_the_http_transport_serves_on_loopback_only():
    """`--transport http` binds 127.0.0.1 by default and speaks streamable HTTP."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "server.py", "--transport", "http", "--port", str(port), "--no-prewarm"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TORCH_SKILLS_TOKEN": TEST_TOKEN},
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            await anyio.sleep(0.1)
        else:
            pytest.fail(f"server did not listen: {proc.stderr.read().decode() if proc.stderr else ''}")
        listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True)
        if listening.returncode == 0 and listening.stdout.strip():  # ss present: check the bound address
            local_addresses = {line.split()[3].rsplit(":", 1)[0] for line in listening.stdout.splitlines()}
            assert local_addresses == {"127.0.0.1"}
        async with http_client(f"http://127.0.0.1:{port}/mcp", TEST_TOKEN) as c:
            result = await c.call_tool("route", {"query": "torch.load says Weights only load failed"})
            assert result.structured_content["skills"][0] == "checkpointing-and-reproducibility"
    finally:
        proc.terminate()
        proc.wait(timeout=10)

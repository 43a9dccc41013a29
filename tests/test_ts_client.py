"""A client nobody here wrote: the official TypeScript SDK (@modelcontextprotocol/sdk) over stdio and HTTP.

The SDK is installed once from the npm registry into tests/clients/node_modules (ignored by
git; the version is pinned in tests/clients/package.json). Without node, npm or the registry the
tests are skipped with the reason. tests/clients/ts_client.mjs does the talking and prints a
JSON report.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.http_client import TEST_TOKEN

REPO = Path(__file__).resolve().parents[1]
CLIENTS = REPO / "tests" / "clients"
MODEL = "tests/fixtures/client_models.py"
SKILLS = "io.modelcontextprotocol/skills"


@pytest.fixture(scope="module")
def node_client() -> Path:
    """tests/clients with @modelcontextprotocol/sdk installed (once), or a skip saying why not."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the TypeScript SDK client test")
    if not (CLIENTS / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json").exists():
        install = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=CLIENTS,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if install.returncode != 0:
            pytest.skip(f"npm could not install @modelcontextprotocol/sdk: {install.stderr.strip()[-300:]}")
    return CLIENTS


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dict of the fixture model, saved by torch (in this test process, not the server)."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("client_models", REPO / MODEL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path_factory.mktemp("ckpt") / "model.pt"
    torch.save(module.build().state_dict(), path)
    return path


def _tour_options(checkpoint: Path) -> dict:
    return {
        "cwd": str(REPO),
        "calls": {
            "route": {"query": "loss becomes NaN after a few hundred steps"},
            "list_skills": {},
            "get_skill": {"name": "debugging-techniques"},
            "check_gradients": {"model": f"{MODEL}:build", "inputs": f"{MODEL}:make_inputs"},
            # stringified list/object arguments, as some clients send them
            "estimate_memory": {
                "model": f"{MODEL}:build",
                "model_kwargs": '{"layers": 2}',
                "input_shape": "[8, 16]",
                "activation_checkpointing": '["Block"]',
            },
            "profile_model": {
                "model": f"{MODEL}:build",
                "input_shape": [8, 16],
                "warmup_steps": 1,
                "active_steps": 3,
            },
            "verify_checkpoint": {"path": str(checkpoint), "model": f"{MODEL}:build"},
            "check_distributed": {"model": f"{MODEL}:build", "input_shape": [8, 16], "steps": 1},
        },
        "cancel": {
            "name": "check_gradients",
            "arguments": {"model": f"{MODEL}:build", "model_kwargs": {"sleep_s": 60}, "input_shape": [8, 16]},
        },
    }


def _run_node(client_dir: Path, *args: str, timeout: float) -> dict:
    out = subprocess.run(
        ["node", str(client_dir / "ts_client.mjs"), *args],
        cwd=client_dir,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert "fatal" not in report, report["fatal"] + out.stderr[-2000:]
    return report


def _assert_tour(report: dict) -> None:
    assert report["skillsDeclared"] == {"experimental": True, "extensions": True}
    assert "using-pytorch-engineering" in report["skills"] and report["skillGet"].endswith("/SKILL.md")
    assert set(report["tools"]) == set(report["calls"])
    for name, call in report["calls"].items():
        assert "error" not in call, (name, call)
        assert call["isError"] is False, (name, call["text"])
        assert call["hasStructured"] and call["schemaValid"], (name, call.get("schemaErrors"))
        assert call["textIsCompactJson"], name
        assert call["progress"]["problems"] == [], (name, call["progress"])
    for torch_tool in (
        "check_gradients",
        "estimate_memory",
        "profile_model",
        "verify_checkpoint",
        "check_distributed",
    ):
        assert report["calls"][torch_tool]["progress"]["count"] >= 1, torch_tool
    cancel = report["cancel"]
    assert cancel["outcome"] == "rejected" and "test cancels" in cancel["error"]
    assert cancel["seconds"] < 30 and cancel["serverStillAnswers"]


def _server_command(checkpoint: Path, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "server.py"), "--allow", str(checkpoint.parent), *extra]


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
def test_the_typescript_sdk_client_uses_every_tool_over_stdio(node_client: Path, checkpoint: Path):
    """Over stdio the TS client finds the Skills extension, calls each tool, gets valid results, progress, and cancels."""
    report = _run_node(
        node_client,
        "tour",
        "stdio",
        json.dumps(_server_command(checkpoint)),
        json.dumps(_tour_options(checkpoint)),
        timeout=300,
    )
    _assert_tour(report)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # the stdio tour covers every tool in the quick set; HTTP runs in the slow step
def test_the_typescript_sdk_client_uses_every_tool_over_streamable_http(
    node_client: Path, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
):
    """The same tour over streamable HTTP on 127.0.0.1, with the bearer token the server needs."""
    monkeypatch.setenv("TORCH_SKILLS_TOKEN", TEST_TOKEN)  # the server and the node client both read it
    port = _free_port()
    server = subprocess.Popen(
        _server_command(checkpoint, "--transport", "http", "--port", str(port)),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            pytest.fail("the HTTP server did not listen within 60 s")
        report = _run_node(
            node_client,
            "tour",
            "http",
            f"http://127.0.0.1:{port}/mcp",
            json.dumps(_tour_options(checkpoint)),
            timeout=300,
        )
        _assert_tour(report)
    finally:
        server.terminate()
        server.wait(timeout=15)


@pytest.mark.slow
def test_a_90_second_call_survives_the_typescript_clients_60_second_reset_on_progress_timeout(
    node_client: Path, checkpoint: Path
):
    """A model that takes 90 s to build: the heartbeat keeps a 60 s timeout (reset on progress) from firing."""
    options = {
        "cwd": str(REPO),
        "name": "check_gradients",
        "arguments": {
            "model": f"{MODEL}:build",
            "model_kwargs": {"sleep_s": 90},
            "input_shape": [8, 16],
            "timeout_s": 300,
        },
    }
    report = _run_node(
        node_client,
        "long",
        "stdio",
        json.dumps(_server_command(checkpoint)),
        json.dumps(options),
        timeout=400,
    )
    assert "error" not in report, report
    assert report["isError"] is False, report["text"]
    assert report["seconds"] >= 90
    assert report["progress"]["problems"] == []
    assert report["progress"]["maxGap"] <= 10, report["progress"]

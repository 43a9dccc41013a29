"""Allowed roots: the server's folder, --allow flags, and the client's MCP roots when it has them."""

from __future__ import annotations

from pathlib import Path

import mcp_types as t
import pytest
from mcp import Client

from torch_skills.server import build_server

MODEL = "import torch\n\ndef build():\n    return torch.nn.Linear(4, 2)\n"


def _outside_model(tmp_path: Path) -> str:
    (tmp_path / "outside.py").write_text(MODEL)
    return f"{tmp_path / 'outside.py'}:build"


async def test_a_model_outside_every_root_is_refused_with_the_roots_named(tmp_path: Path):
    """Without a root covering the file, the call fails before any code runs and says how to fix it."""
    async with Client(build_server(prewarm=False)) as client:
        result = await client.call_tool(
            "check_gradients", {"model": _outside_model(tmp_path), "input_shape": [3, 4]}
        )
    assert result.is_error
    text = result.content[0].text
    assert "outside the allowed roots" in text and str(Path.cwd()) in text and "--allow" in text


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_a_client_root_admits_a_model_outside_the_servers_folder(tmp_path: Path):
    """A client that offers its roots (MCP roots capability) can point the tools at its workspace."""
    asked = []

    async def list_roots(_ctx) -> t.ListRootsResult:
        asked.append(True)
        return t.ListRootsResult(roots=[t.Root(uri=tmp_path.as_uri(), name="workspace")])

    async with Client(build_server(), list_roots_callback=list_roots) as client:
        inside = await client.call_tool(
            "check_gradients", {"model": "tests/fixtures/gradient_zoo.py:healthy_mlp", "input_shape": [4, 16]}
        )
        assert not inside.is_error and not asked  # no round trip when the server's own roots suffice
        outside = await client.call_tool(
            "check_gradients", {"model": _outside_model(tmp_path), "input_shape": [3, 4]}
        )
    assert not outside.is_error, outside.content[0].text
    assert asked
    assert outside.structured_content["summary"]


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
async def test_an_allow_flag_admits_its_folder(tmp_path: Path):
    """`--allow DIR` adds a root for every client."""
    async with Client(build_server(allow=[tmp_path])) as client:
        result = await client.call_tool(
            "check_gradients", {"model": _outside_model(tmp_path), "input_shape": [3, 4]}
        )
    assert not result.is_error, result.content[0].text

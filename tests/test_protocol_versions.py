"""Raw JSON-RPC over stdio at every handshake protocol version: what a spec-following client sees.

No SDK on the client side: each test writes the messages a client of that version would write
to `python server.py` and reads the answers line by line, so what is checked is the wire.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SKILLS = "io.modelcontextprotocol/skills"
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")


class RawClient:
    """`python server.py` driven by hand: send a request, read until its response arrives."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "server.py"), "--no-prewarm"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._next_id = 0

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            message["params"] = params
        self._write(message)
        while True:
            line = self.proc.stdout.readline()  # type: ignore[union-attr]
            assert line, f"server closed stdout; stderr: {self.proc.stderr.read()}"  # type: ignore[union-attr]
            reply = json.loads(line)
            if reply.get("id") == self._next_id:
                return reply

    def notify(self, method: str) -> None:
        self._write({"jsonrpc": "2.0", "method": method})

    def _write(self, message: dict[str, Any]) -> None:
        self.proc.stdin.write(json.dumps(message) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def close(self) -> str:
        """Stop the server; return what it wrote on stderr."""
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=20)
        return self.proc.stderr.read()  # type: ignore[union-attr]


def _initialize(client: RawClient, version: str, capabilities: dict[str, Any]) -> dict[str, Any]:
    reply = client.request(
        "initialize",
        {
            "protocolVersion": version,
            "capabilities": capabilities,
            "clientInfo": {"name": "raw", "version": "0"},
        },
    )
    client.notify("notifications/initialized")
    return reply["result"]


def _declares_skills(capabilities: dict[str, Any]) -> bool:
    """How a spec-following client decides: the declaration under extensions, else under experimental."""
    return SKILLS in (capabilities.get("extensions") or {}) or SKILLS in (
        capabilities.get("experimental") or {}
    )


@pytest.mark.parametrize("version", HANDSHAKE_VERSIONS)
def test_a_client_of_each_protocol_version_discovers_and_uses_the_skills_extension(version: str):
    """initialize declares the extension (experimental; extensions too when the client sent one), then skills/list and skills/get work."""
    client = RawClient()
    try:
        result = _initialize(client, version, {"extensions": {SKILLS: {}}})
        assert result["protocolVersion"] == version
        capabilities = result["capabilities"]
        assert capabilities["experimental"][SKILLS] == {}
        assert capabilities["extensions"][SKILLS] == {}
        assert "resources" in capabilities
        assert _declares_skills(capabilities)
        listing = client.request("skills/list", {})["result"]
        names = [s["frontmatter"]["name"] for s in listing["skills"]]
        assert "using-pytorch-engineering" in names and "nextCursor" not in listing
        assert "ttlMs" not in listing  # a 2026-07-28 field, not in these versions' schemas
        for skill in listing["skills"]:
            assert all(r["digest"].startswith("sha256:") and r["size"] > 0 for r in skill["resources"])
        got = client.request("skills/get", {"uri": listing["skills"][0]["uri"]})["result"]
        assert got["skill"] == listing["skills"][0]
    finally:
        assert client.close() == ""


def test_a_client_that_sends_no_extensions_sees_the_declaration_under_experimental_only():
    """No `extensions` in the client's capabilities: the server does not send one either."""
    client = RawClient()
    try:
        capabilities = _initialize(client, "2025-11-25", {})["capabilities"]
        assert SKILLS in capabilities["experimental"] and "extensions" not in capabilities
    finally:
        client.close()


def test_protocol_errors_carry_invalid_params_and_say_what_to_send():
    """prompts/get and skills/* mistakes answer -32602 with a useful message and leave stderr empty."""
    client = RawClient()
    try:
        _initialize(client, "2025-06-18", {})
        unknown = client.request("prompts/get", {"name": "no-such-prompt"})["error"]
        assert unknown["code"] == -32602 and "debugging-techniques" in unknown["message"]
        missing = client.request("prompts/get", {"name": "debugging-techniques"})["error"]
        assert missing["code"] == -32602 and "problem" in missing["message"]
        rendered = client.request(
            "prompts/get", {"name": "debugging-techniques", "arguments": {"problem": "NaN loss"}}
        )
        assert "NaN loss" in rendered["result"]["messages"][0]["content"]["text"]
        cursor = client.request("skills/list", {"cursor": "bogus"})["error"]
        assert cursor["code"] == -32602 and "cursor" in cursor["message"]
        no_uri = client.request("skills/get", {})["error"]
        assert no_uri["code"] == -32602 and "'uri'" in no_uri["message"]
        unknown_skill = client.request("skills/get", {"uri": "skill://nope/SKILL.md"})["error"]
        assert unknown_skill["code"] == -32602 and "skill://nope/SKILL.md" in unknown_skill["message"]
        resources = client.request("resources/list", {})["result"]["resources"]
        for resource in resources:  # the extension defines no _meta keys: none under its prefix
            assert not any(
                k.startswith("io.modelcontextprotocol.skills/") for k in resource.get("_meta") or {}
            )
    finally:
        assert client.close() == ""


def test_a_2026_07_28_client_discovers_the_extension_through_server_discover():
    """The stateless era: server/discover declares capabilities.extensions; skills/* carry the caching fields."""
    client = RawClient()
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {SKILLS: {}}},
    }
    try:
        discovered = client.request("server/discover", {"_meta": meta})["result"]
        assert _declares_skills(discovered["capabilities"]) and "resources" in discovered["capabilities"]
        listing = client.request("skills/list", {"_meta": meta})["result"]
        assert (
            listing["resultType"] == "complete" and listing["ttlMs"] > 0 and listing["cacheScope"] == "public"
        )
        got = client.request("skills/get", {"uri": listing["skills"][0]["uri"], "_meta": meta})["result"]
        assert got["skill"]["uri"] == listing["skills"][0]["uri"] and got["ttlMs"] > 0
        bad = client.request("skills/get", {"uri": "skill://nope/SKILL.md", "_meta": meta})["error"]
        assert bad["code"] == -32602
    finally:
        assert client.close() == ""

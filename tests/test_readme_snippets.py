"""Every client snippet in the README is launched as written and answers tools/list.

Run: `python -m pytest tests/test_readme_snippets.py`.

The README's JSON and TOML blocks (Claude Desktop, Cursor, VS Code, Codex) and its
`claude mcp add` line are parsed, their placeholders replaced with real paths for this machine
(`/path/to/torch-skills/.venv/bin/torch-skills` with a console script of this clone,
`/path/to/your/project` and `${workspaceFolder}` with a temporary project), and the exact command
and arguments they give are started over stdio with the MCP SDK client.

Known limitations: the clients themselves are not run; what is checked is that the command each
snippet names starts a working server, and that each snippet has its client's documented shape.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SCRIPT_PLACEHOLDER = "/path/to/torch-skills/.venv/bin/torch-skills"
PROJECT_PLACEHOLDERS = ("/path/to/your/project", "${workspaceFolder}")
SERVER_NAME = "torch-skills"
EXPECTED_TOOLS = {
    "route", "list_skills", "get_skill", "check_gradients", "estimate_memory", "profile_model", "verify_checkpoint",
    "check_distributed",
}  # fmt: skip
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Snippet:
    kind: str  # "mcpServers" (Claude Desktop, Cursor), "vscode", "codex", "claude-code"
    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


def _from_config(kind: str, config: dict) -> Snippet:
    server = config[SERVER_NAME]
    return Snippet(
        kind, server["command"], tuple(server.get("args", ())), tuple(server.get("env", {}).items())
    )


def _claude_mcp_add(line: str) -> Snippet:
    words = shlex.split(line)
    assert words[:3] == ["claude", "mcp", "add"] and "--" in words, line
    options, command = words[3 : words.index("--")], words[words.index("--") + 1 :]
    assert options[-1] == SERVER_NAME, f"the server name goes right before `--`: {line}"
    if "--transport" in options:
        assert options[options.index("--transport") + 1] == "stdio"
    env = tuple(
        tuple(v.split("=", 1)) for k, v in zip(options, options[1:], strict=False) if k in ("-e", "--env")
    )
    return Snippet("claude-code", command[0], tuple(command[1:]), env)


def readme_snippets() -> list[Snippet]:
    """Every client configuration the README gives, parsed."""
    snippets = []
    for lang, body in FENCE.findall(README.read_text()):
        if lang == "json":
            config = json.loads(body)
            if "servers" in config:  # VS Code's .vscode/mcp.json
                assert config["servers"][SERVER_NAME]["type"] == "stdio"
                snippets.append(_from_config("vscode", config["servers"]))
            else:
                snippets.append(_from_config("mcpServers", config["mcpServers"]))
        elif lang == "toml":
            snippets.append(_from_config("codex", tomllib.loads(body)["mcp_servers"]))
        elif lang == "bash":
            snippets += [
                _claude_mcp_add(line) for line in body.splitlines() if line.startswith("claude mcp add")
            ]
    return snippets


SNIPPETS = readme_snippets()


def test_the_readme_covers_every_client():
    """Claude Code, Claude Desktop and Cursor (mcpServers), VS Code (servers) and Codex each have a snippet."""
    kinds = [s.kind for s in SNIPPETS]
    assert kinds.count("claude-code") == 1
    assert kinds.count("mcpServers") >= 2  # Claude Desktop and Cursor
    assert kinds.count("vscode") == 1 and kinds.count("codex") == 1


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: f"{s.kind}:{' '.join(s.args) or 'no-args'}")
def test_no_snippet_runs_a_bare_python(snippet):
    """Each command is the venv's console script by absolute path, never `python` from the client's PATH."""
    assert snippet.command == SCRIPT_PLACEHOLDER
    assert not re.search(r"(^|/)python[0-9.]*$", snippet.command)


@pytest.fixture(scope="module")
def console_script(tmp_path_factory) -> Path:
    """An executable `torch-skills` for this clone, standing in for `.venv/bin/torch-skills`."""
    path = tmp_path_factory.mktemp("venv-bin") / "torch-skills"
    path.write_text(
        f"#!{sys.executable}\nimport runpy\nrunpy.run_path({str(REPO / 'server.py')!r}, run_name='__main__')\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _substitute(value: str, script: Path, project: Path) -> str:
    value = value.replace(SCRIPT_PLACEHOLDER, str(script))
    for placeholder in PROJECT_PLACEHOLDERS:
        value = value.replace(placeholder, str(project))
    assert "/path/to/" not in value, f"unknown placeholder left in {value!r}"
    return value


# The first snippet launches in the quick set; every other one in the slow step (each starts a server).
LAUNCHES = [pytest.param(s, marks=() if i == 0 else pytest.mark.slow) for i, s in enumerate(SNIPPETS)]


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
@pytest.mark.parametrize("snippet", LAUNCHES, ids=lambda s: f"{s.kind}:{' '.join(s.args) or 'no-args'}")
async def test_each_snippet_starts_a_server_that_lists_the_tools(snippet, console_script, tmp_path):
    """The snippet's command and arguments, with real paths, serve over stdio and list all seven tools."""
    project = tmp_path / "project"
    project.mkdir()
    # Claude Code starts the server in the project; the others are started elsewhere and rely on --allow.
    cwd = project if snippet.kind == "claude-code" else tmp_path
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({k: _substitute(v, console_script, project) for k, v in snippet.env})
    params = StdioServerParameters(
        command=_substitute(snippet.command, console_script, project),
        args=[_substitute(a, console_script, project) for a in snippet.args],
        cwd=str(cwd),
        env=env,
    )
    async with Client(params) as c:
        names = {t.name for t in (await c.list_tools()).tools}
    assert names == EXPECTED_TOOLS

"""The Claude Code plugin: its manifests follow the documented schema and every path they name exists.

Run: `python -m pytest tests/test_plugin_manifests.py`.

The schemas in tests/schemas/ are written from Claude Code's plugins reference and marketplace
reference (see their `$comment`). This repository is both the marketplace and its one plugin
(`"source": "./"`): `claude plugin marketplace add <this repo>` then
`claude plugin install torch-skills@torch-skills` gives the skills (the default `skills/` folder
at the plugin root) and the MCP server (`mcpServers` in plugin.json, started with
`uvx --from ${CLAUDE_PLUGIN_ROOT} torch-skills`). tests/test_run_without_clone.py launches that
exact command.

Known limitations: Claude Code itself is not run here; `claude plugin validate` is not available
on this machine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
PLUGIN_DIR = REPO / ".claude-plugin"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
PLUGIN_ROOT_VAR = "${CLAUDE_PLUGIN_ROOT}"


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _validator(name: str) -> jsonschema.Draft202012Validator:
    resources = [
        (p.name, Resource.from_contents(_load(p), DRAFT202012)) for p in SCHEMAS.glob("*.schema.json")
    ]
    registry = Registry().with_resources(resources)
    return jsonschema.Draft202012Validator(_load(SCHEMAS / name), registry=registry)


def _errors(schema: str, document: dict) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in _validator(schema).iter_errors(document)
    ]


def _plugin() -> dict:
    return _load(PLUGIN_DIR / "plugin.json")


def _marketplace() -> dict:
    return _load(PLUGIN_DIR / "marketplace.json")


def _project_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _resolve(path: str, root: Path) -> Path:
    """A manifest path (./x or ${CLAUDE_PLUGIN_ROOT}/x) as a path under the plugin root."""
    path = path.replace(PLUGIN_ROOT_VAR, ".")
    assert path.startswith("./") or path == ".", f"{path!r} is not relative to the plugin root"
    resolved = (root / path).resolve()
    assert resolved.is_relative_to(root.resolve()), f"{path!r} leaves the plugin root"
    return resolved


def test_plugin_json_matches_the_documented_schema():
    """plugin.json has the required kebab-case name, typed metadata, and nothing Claude Code would ignore."""
    assert _errors("claude_plugin.schema.json", _plugin()) == []


def test_marketplace_json_matches_the_documented_schema():
    """marketplace.json has name, owner and plugins; each entry a name and a ./ source; no unknown keys."""
    assert _errors("claude_marketplace.schema.json", _marketplace()) == []


@pytest.mark.parametrize(
    ("schema", "document", "complaint"),
    [
        ("claude_plugin.schema.json", {"name": "Torch Skills"}, "does not match"),
        ("claude_plugin.schema.json", {"version": "0.2.0"}, "'name' is a required property"),
        ("claude_plugin.schema.json", {"name": "x", "skills": "../skills"}, "is not valid"),
        ("claude_plugin.schema.json", {"name": "x", "mcpServers": {"s": {"args": []}}}, "is not valid"),
        ("claude_plugin.schema.json", {"name": "x", "mcpServer": {}}, "Additional properties"),
        ("claude_marketplace.schema.json", {"name": "m", "plugins": [{"name": "x", "source": "./"}]}, "'owner'"),
        ("claude_marketplace.schema.json", {"name": "m", "owner": {"name": "o"}, "plugins": [{"name": "x", "source": "."}]}, "is not valid"),
        ("claude_marketplace.schema.json", {"name": "claude-plugins-official", "owner": {"name": "o"}, "plugins": [{"name": "x", "source": "./"}]}, "should not be valid"),
    ],
)  # fmt: skip
def test_the_schemas_reject_what_the_docs_forbid(schema, document, complaint):
    """The written schemas are not vacuous: a bad name, a '..' path, a missing owner or command fail."""
    errors = _errors(schema, document)
    assert any(complaint in e for e in errors), errors


def test_the_marketplace_lists_this_repository_as_the_plugin():
    """The marketplace's one entry is this plugin at the marketplace root, with the same name and version."""
    (entry,) = _marketplace()["plugins"]
    plugin_root = _resolve(entry["source"], REPO)
    assert plugin_root == REPO
    assert (plugin_root / ".claude-plugin" / "plugin.json").is_file()
    assert entry["name"] == _plugin()["name"]
    assert entry["version"] == _plugin()["version"] == _project_version()


def test_every_skill_folder_loads_as_a_plugin_skill():
    """The plugin root's skills/ holds one folder per skill whose SKILL.md frontmatter names it and says when to use it."""
    assert "skills" not in _plugin(), "the default skills/ folder is used; a custom path would be added to it"
    folders = sorted(
        p for p in (REPO / "skills").iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
    )
    assert folders
    for folder in folders:
        text = (folder / "SKILL.md").read_text()
        match = re.match(r"^---\n(.*?)\n---\n", text, re.S)
        assert match, f"{folder.name}/SKILL.md has no frontmatter"
        front = yaml.safe_load(match.group(1))
        assert front["name"] == folder.name
        assert 0 < len(front["description"]) <= 1024


def test_the_mcp_server_entry_launches_the_console_script_from_the_plugin_root():
    """The plugin's server is `uvx --from ${CLAUDE_PLUGIN_ROOT} torch-skills`: a buildable project with that script."""
    servers = _plugin()["mcpServers"]
    assert list(servers) == ["torch-skills"]
    server = servers["torch-skills"]
    assert server["command"] == "uvx"
    args = server["args"]
    source = args[args.index("--from") + 1]
    assert _resolve(source, REPO) == REPO
    assert (REPO / "pyproject.toml").is_file()
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert args[args.index("--from") + 2] in scripts
    for arg in args:  # every other path the entry names exists too
        if PLUGIN_ROOT_VAR in arg:
            assert _resolve(arg, REPO).exists(), arg


def test_no_root_mcp_json_clashes_with_the_plugin_entry():
    """A root .mcp.json would also be read as project config in a clone, where ${CLAUDE_PLUGIN_ROOT} is unset."""
    root_config = REPO / ".mcp.json"
    if root_config.exists():
        assert PLUGIN_ROOT_VAR not in root_config.read_text()

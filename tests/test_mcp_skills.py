"""Skills over MCP, three ways from one source: the Skills extension, skill:// resources, and tools."""

from __future__ import annotations

import base64
import hashlib

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import Request, RequestParams
from pydantic import TypeAdapter

from torch_skills.skillpack.loader import DEFAULT_SKILLS_DIR, ROUTER_NAME, SkillPack

PACK = SkillPack.load(DEFAULT_SKILLS_DIR)
_DICT = TypeAdapter(dict)


class _GetParams(RequestParams):
    uri: str


async def _skills_request(client: Client, method: str, params: RequestParams) -> dict:
    return await client.session.send_request(Request(method=method, params=params), _DICT)


def _bytes_of(contents) -> bytes:
    item = contents[0]
    return item.text.encode("utf-8") if hasattr(item, "text") else base64.b64decode(item.blob)


async def test_the_server_declares_the_skills_extension_and_points_to_the_router(client: Client):
    """Capabilities name io.modelcontextprotocol/skills; instructions say where to start."""
    extensions = client.server_capabilities.extensions or {}
    assert "io.modelcontextprotocol/skills" in extensions
    assert client.server_capabilities.resources is not None
    assert f"skill://{ROUTER_NAME}/SKILL.md" in (client.instructions or "")
    assert "route" in (client.instructions or "")


async def test_skills_list_returns_a_complete_manifest_whose_digests_match_the_bytes_read(client: Client):
    """Every file listed by skills/list reads back over resources/read with the listed size and digest."""
    listing = await _skills_request(client, "skills/list", RequestParams())
    assert listing["resultType"] == "complete" and listing["ttlMs"] > 0 and listing["cacheScope"]
    assert {s["frontmatter"]["name"] for s in listing["skills"]} == set(PACK.skills)
    checked = 0
    for skill in listing["skills"]:
        assert skill["uri"] == f"skill://{skill['frontmatter']['name']}/SKILL.md"
        for resource in skill["resources"]:
            read = await client.read_resource(resource["uri"])
            data = _bytes_of(read.contents)
            assert len(data) == resource["size"]
            assert "sha256:" + hashlib.sha256(data).hexdigest() == resource["digest"]
            checked += 1
    assert checked == sum(len(s.files) for s in PACK.skills.values())


async def test_skills_get_returns_one_entry_and_rejects_an_unknown_skill_with_invalid_params(client: Client):
    """skills/get answers for a served skill and fails with -32602 otherwise."""
    got = await _skills_request(client, "skills/get", _GetParams(uri="skill://debugging-techniques/SKILL.md"))
    assert got["skill"]["frontmatter"] == PACK.get("debugging-techniques").frontmatter
    for uri in (
        "skill://no-such-skill/SKILL.md",
        "https://example.com/SKILL.md",
        "skill://debugging-techniques/x.md",
    ):
        with pytest.raises(MCPError) as err:
            await _skills_request(client, "skills/get", _GetParams(uri=uri))
        assert err.value.error.code == -32602


async def test_every_skill_file_is_a_listed_resource_and_skill_md_is_markdown(client: Client):
    """resources/list holds each file once; SKILL.md carries text/markdown."""
    listed = {str(r.uri): r for r in (await client.list_resources()).resources}
    for skill in PACK.skills.values():
        for file in skill.files:
            assert skill.uri(file.path) in listed
        assert listed[skill.uri()].mime_type == "text/markdown"
        assert listed[skill.uri()].description == skill.description


@pytest.mark.parametrize(
    "uri",
    [
        "skill://debugging-techniques/../using-pytorch-engineering/SKILL.md",
        "skill://debugging-techniques/%2e%2e/%2e%2e/pyproject.toml",
        "skill://debugging-techniques//etc/passwd",
        "skill://../../pyproject.toml",
        "skill://nope/SKILL.md",
    ],
)
async def test_unknown_or_escaping_resource_uris_are_refused(client: Client, uri: str):
    """Only the listed files are readable; traversal never reaches another file."""
    with pytest.raises(MCPError):
        await client.read_resource(uri)


async def test_list_skills_and_get_skill_serve_clients_that_only_call_tools(client: Client):
    """The tool fallbacks return the same names, files and text as the extension."""
    listing = await client.call_tool("list_skills", {})
    assert not listing.is_error
    data = listing.structured_content
    assert data["start_with"] == ROUTER_NAME
    assert {s["name"] for s in data["skills"]} == set(PACK.skills)
    text = await client.call_tool("get_skill", {"name": ROUTER_NAME})
    assert text.structured_content["text"] == PACK.read(ROUTER_NAME).decode()


async def test_get_skill_refuses_traversal_with_a_message_the_model_can_act_on(client: Client):
    """A bad path is a tool error listing the skill's files, not a crash."""
    result = await client.call_tool(
        "get_skill", {"name": "debugging-techniques", "path": "../../pyproject.toml"}
    )
    assert result.is_error
    assert "not a relative path inside the skill" in result.content[0].text
    result = await client.call_tool("get_skill", {"name": "nope"})
    assert result.is_error and "debugging-techniques" in result.content[0].text


async def test_each_specialist_has_a_prompt_that_names_its_skill_and_tool(client: Client):
    """A user can start a specialist from the client's prompt menu."""
    prompts = {p.name: p for p in (await client.list_prompts()).prompts}
    assert set(prompts) == set(PACK.skills) - {ROUTER_NAME}
    got = await client.get_prompt("debugging-techniques", {"problem": "loss is NaN after 2 epochs"})
    text = got.messages[0].content.text
    assert "skill://debugging-techniques/SKILL.md" in text
    assert "check_gradients" in text
    assert "loss is NaN after 2 epochs" in text


async def test_route_over_mcp_returns_structured_skills_and_evidence(client: Client):
    """The route tool's result is structured content with the reading order."""
    result = await client.call_tool("route", {"query": "DDP hangs at the first all_reduce"})
    assert not result.is_error
    assert result.structured_content["skills"][0] == "distributed-training-strategies"
    assert result.structured_content["evidence"]["distributed-training-strategies"]


ODD_PATHS = ["SKILL\x00.md", "references/\x00", "a\nb.md", "SKILL.md\x7f", "refer\udc80ences/x.md"]


@pytest.mark.parametrize("path", ODD_PATHS)
async def test_get_skill_with_a_nul_or_control_character_in_the_path_is_a_clear_tool_error(
    client: Client, path: str
):
    """A NUL, newline, control or undecodable character names the character and lists the files."""
    result = await client.call_tool("get_skill", {"name": "debugging-techniques", "path": path})
    assert result.is_error
    text = result.content[0].text
    assert "which no skill file name has" in text and "references/" in text


@pytest.mark.parametrize("path", ODD_PATHS[:4])
async def test_skills_get_and_resources_with_odd_characters_answer_with_a_clear_error(
    client: Client, path: str
):
    """skills/get says the character is wrong (-32602); resources/read says the resource is unknown."""
    with pytest.raises(MCPError) as err:
        await _skills_request(client, "skills/get", _GetParams(uri=f"skill://debugging-techniques/{path}"))
    assert err.value.error.code == -32602
    with pytest.raises(MCPError) as err:
        await client.read_resource(f"skill://debugging-techniques/{path}")
    assert "Unknown resource" in str(err.value)

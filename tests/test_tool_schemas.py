"""tools/list as clients get it: input schemas every major client accepts, a small wire, lenient arguments.

The accepted subsets below are written from each vendor's documentation of tool/function
parameter schemas (read in 2026): Gemini function declarations take a subset of the OpenAPI 3.0
Schema object; OpenAI function calling in strict mode takes a subset of JSON Schema; Anthropic's
`input_schema` is JSON Schema with an object at the top and no top-level combinators.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import Client

GEMINI = {
    # the fields of the Gemini API `Schema` object that function declarations honour
    "keywords": {
        "type",
        "format",
        "description",
        "nullable",
        "enum",
        "items",
        "properties",
        "required",
        "minItems",
        "maxItems",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
    },
    "types": {"string", "number", "integer", "boolean", "array", "object"},
    "enum_only_on": {"string"},
    "object_needs_properties": True,  # "properties: should be non-empty for OBJECT type"
}
OPENAI_STRICT = {
    # JSON Schema keywords structured outputs / strict function calling supports
    "keywords": {
        "type",
        "description",
        "properties",
        "required",
        "additionalProperties",
        "enum",
        "const",
        "anyOf",
        "items",
        "$ref",
        "$defs",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "pattern",
        "format",
        "minItems",
        "maxItems",
    },
    "root_type": "object",
    "free_form_objects": False,  # every object lists its properties
}
CLAUDE = {
    "root_type": "object",
    "no_top_level": {"oneOf", "anyOf", "allOf"},
}
# 40,000 held the first four torch tools (39,977 bytes); check_distributed, the fifth and smallest
# (about 6.5 kB: the shared user-code arguments alone are 2 kB), moved it. verify_checkpoint's PEFT
# adapter check and per-loader calls (AdapterCheck, AdapterProblem, LoaderCall: 1.6 kB) moved it again
# from 47,956 bytes. estimate_memory's kernel_scratch_bytes and checkpointing_options (CheckpointOption)
# add about 0.3 kB.
WIRE_LIMIT_BYTES = 49_900


def _nodes(schema: dict[str, Any]):
    """Every sub-schema of a (portable, $ref-free) schema, the root first."""
    yield schema
    for prop in (schema.get("properties") or {}).values():
        yield from _nodes(prop)
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"])


def _problems(schema: dict[str, Any]) -> list[str]:
    problems = []
    for rule, subset in (("Claude", CLAUDE), ("OpenAI strict", OPENAI_STRICT)):
        if schema.get("type") != subset["root_type"]:
            problems.append(f"{rule}: the root is not an object")
    problems += [f"Claude: top-level {k}" for k in CLAUDE["no_top_level"] & set(schema)]
    for node in _nodes(schema):
        for rule, subset in (("Gemini", GEMINI), ("OpenAI strict", OPENAI_STRICT)):
            extra = set(node) - subset["keywords"]
            if extra:
                problems.append(f"{rule}: keywords {sorted(extra)} in {node}")
        kind = node.get("type")
        if kind not in GEMINI["types"]:
            problems.append(f"Gemini: type {kind!r} in {node}")
        if "enum" in node and kind not in GEMINI["enum_only_on"]:
            problems.append(f"Gemini: enum on a {kind}")
        if kind == "object" and node is not schema and not node.get("properties"):
            problems.append(f"Gemini / OpenAI strict: free-form object {node}")
        required = set(node.get("required", []))
        if not required <= set(node.get("properties", {})):
            problems.append(f"required names unknown properties: {required}")
    return problems


@pytest.fixture(scope="module")
async def wire_tools(client: Client) -> list[dict[str, Any]]:
    return [
        t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in (await client.list_tools()).tools
    ]


async def test_every_input_schema_fits_what_gemini_openai_and_claude_accept(wire_tools):
    """No keyword outside the three documented subsets, one type per node, no free-form objects."""
    for tool in wire_tools:
        assert _problems(tool["inputSchema"]) == [], tool["name"]


async def test_tools_list_stays_under_40_kb_and_keeps_what_a_model_reads(wire_tools):
    """The whole tools/list result is small; every argument still has its description and type."""
    size = len(json.dumps({"tools": wire_tools}, separators=(",", ":")).encode())
    assert size <= WIRE_LIMIT_BYTES, size
    for tool in wire_tools:
        assert len(tool["description"]) > 40 and "\n    " not in tool["description"]
        for name, prop in tool["inputSchema"]["properties"].items():
            assert prop.get("description") and prop.get("type"), (tool["name"], name)
        if tool["name"] in {"check_gradients", "estimate_memory", "profile_model", "verify_checkpoint"}:
            out = tool["outputSchema"]
            assert {"findings", "summary", "run"} <= set(out["properties"])
            assert "Finding" in out["$defs"]
        if tool["name"] == "check_distributed":
            out = tool["outputSchema"]
            assert {"findings", "summary", "run", "ranks"} <= set(out["properties"])
            assert "DistributedFinding" in out["$defs"]


async def test_defaults_and_bounds_reach_the_model_through_the_descriptions(wire_tools):
    """What `default` and `exclusiveMinimum` said is still there, in words and as `minimum`."""
    profile = next(t for t in wire_tools if t["name"] == "profile_model")["inputSchema"]["properties"]
    assert "default 300" in profile["timeout_s"]["description"] and profile["timeout_s"]["minimum"] == 0
    assert "> 0" in profile["timeout_s"]["description"]
    memory = next(t for t in wire_tools if t["name"] == "estimate_memory")["inputSchema"]["properties"]
    assert memory["activation_checkpointing"]["type"] == "array"
    assert "'off'" in memory["activation_checkpointing"]["description"]
    assert (
        memory["model_kwargs"]["type"] == "string" and "JSON object" in memory["model_kwargs"]["description"]
    )


async def test_results_carry_compact_json_text_and_structured_content_that_fits_the_schema(client: Client):
    """The text copy of a result is one line of JSON equal to the structured content."""
    result = await client.call_tool("route", {"query": "CUDA out of memory at the first backward"})
    text = result.content[0].text
    assert "\n" not in text and ": " not in text
    assert json.loads(text) == result.structured_content


MODEL = "tests/fixtures/client_models.py:build"


@pytest.mark.parametrize(
    "arguments",
    [
        {"activation_checkpointing": '["Block"]', "model_kwargs": '{"layers": 2}', "input_shape": "[8, 16]"},
        {"activation_checkpointing": "Block", "model_kwargs": {"layers": 2}, "input_shape": [8, 16]},
        {
            "activation_checkpointing": "off",
            "input_shape": "8, 16",
            "batch_size": "4",
            "memory_limit_gib": None,
        },
    ],
    ids=["json-strings", "bare-name", "scalars-as-strings"],
)
async def test_stringified_list_and_object_arguments_are_accepted(client: Client, arguments: dict):
    """A client that sends lists/objects as JSON strings (or a bare name for a list) still works."""
    result = await client.call_tool("estimate_memory", {"model": MODEL, "target_device": "cpu", **arguments})
    assert not result.is_error, result.content[0].text
    assert result.structured_content["peak_allocated_bytes"] > 0


async def test_bad_arguments_are_refused_naming_each_argument_and_what_it_accepts(client: Client):
    """One clause per bad argument, with what it accepts; no pydantic URL."""
    result = await client.call_tool(
        "estimate_memory", {"model": MODEL, "input_shape": "[8, x]", "world_size": 0, "precision": "fp64"}
    )
    assert result.is_error
    text = result.content[0].text
    assert "world_size" in text and "an integer >= 1" in text
    assert "precision" in text and '"bf16"' in text
    assert "input_shape" in text
    assert "pydantic.dev" not in text and "errors.pydantic" not in text
    missing = await client.call_tool("check_gradients", {"model": MODEL})
    assert missing.is_error and "input_shape" in missing.content[0].text
    assert "pydantic.dev" not in missing.content[0].text


async def test_the_skill_tools_explain_bad_arguments_the_same_way(client: Client):
    """route and get_skill argument errors name the argument and its type, without a docs URL."""
    result = await client.call_tool("route", {})
    assert result.is_error
    text = result.content[0].text
    assert "query: Field required" in text and "accepts a string" in text and "pydantic" not in text
    wrong = await client.call_tool("get_skill", {"name": ["debugging-techniques"]})
    assert wrong.is_error and "name:" in wrong.content[0].text and "pydantic" not in wrong.content[0].text

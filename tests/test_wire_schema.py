"""The schema rewrites behind tools/list, on hand-made schemas (tools/wire_schema.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field, ValidationError

from torch_skills.wire_schema import compact_output_schema, explain_invalid_arguments, portable_input_schema


class Inner(BaseModel):
    required: int = Field(description="a field named like a keyword")
    title: str | None = None


class Outer(BaseModel):
    inner: Inner
    maybe: Inner | None = None
    items: list[Inner]


def test_output_compaction_keeps_every_property_and_its_type_even_when_named_like_keywords():
    """Properties called `required`/`title` survive; $defs and $refs stay; prose and titles go."""
    out = compact_output_schema(Outer.model_json_schema())
    inner = out["$defs"]["Inner"]
    assert set(inner["properties"]) == {"required", "title"}
    assert inner["properties"]["required"] == {"type": "integer"}
    assert inner["properties"]["title"] == {"type": ["string", "null"]}
    assert out["properties"]["maybe"] == {"anyOf": [{"$ref": "#/$defs/Inner"}, {"type": "null"}]}
    assert "title" not in out and "required" not in out


def test_portable_input_inlines_refs_and_turns_free_form_objects_into_json_strings():
    """$ref is inlined, optional unions lose their null branch, dicts become described strings."""

    class Args(BaseModel):
        inner: Inner
        options: dict[str, int] = Field(default_factory=dict, description="extra options")
        limit: float = Field(default=2.0, gt=0, le=10, description="a bound")

    schema = portable_input_schema(Args.model_json_schema())
    assert schema["properties"]["inner"]["type"] == "object"
    assert schema["properties"]["inner"]["properties"]["title"]["type"] == "string"
    assert schema["properties"]["options"]["type"] == "string"
    assert "JSON object" in schema["properties"]["options"]["description"]
    limit = schema["properties"]["limit"]
    assert limit == {
        "type": "number",
        "minimum": 0,
        "maximum": 10,
        "description": "a bound; > 0; default 2.0",
    }
    assert schema["required"] == ["inner"]


def test_argument_errors_name_the_argument_and_what_it_accepts_without_a_docs_url():
    """One clause per argument with its accepted values; pydantic's URL never shows."""

    class Args(BaseModel):
        mode: str = Field(pattern="^(a|b)$", description="the mode")
        count: int = Field(ge=1, le=5, description="how many")

    try:
        Args.model_validate({"mode": "c", "count": 0})
    except ValidationError as e:
        text = explain_invalid_arguments(e, "tool", portable_input_schema(Args.model_json_schema()))
    assert "mode:" in text and "count:" in text and "an integer >= 1 and <= 5" in text
    assert "pydantic" not in text

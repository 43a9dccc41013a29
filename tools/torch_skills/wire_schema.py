"""The tool schemas as clients receive them: portable input schemas, compact output schemas.

Use it where tools/list is answered (server.py `TorchSkillsServer.list_tools`):
`portable_input_schema(schema)` and `compact_output_schema(schema)` take the JSON schemas the
SDK derives from the tool functions and return what goes on the wire; `explain_invalid_arguments`
turns a pydantic ValidationError about tool arguments into a message naming each argument and
what it accepts.

Input schemas keep to the subset every major client accepts (tests/test_tool_schemas.py holds
the subsets, taken from the Gemini, OpenAI and Anthropic docs): no `$ref`/`$defs`, no
`anyOf`/`oneOf`, no `additionalProperties`, no `default` (the default goes into the description,
where the model reads it), no `title`, no `exclusiveMinimum`/`exclusiveMaximum` (sent as
`minimum`/`maximum`; the server still refuses the bound itself), one `type` per property, and
no free-form objects (sent as a JSON string: Gemini refuses an object without properties). The
server is laxer than the schema it advertises: a null for an optional argument, a list or
object sent as a JSON string, and a bare name for a list of names all work
(`torch_tools.lenient`).

Output schemas keep what a client checks a result against (every property, its type, enum values,
nullability, the shared `$defs`) and drop the prose: no model reads an output schema (clients
pass a tool to a model as name, description and input schema) and field descriptions were 40%
of tools/list; they stay in the result models. `required` goes too: every result is a full dump
of its pydantic model, so every property is always present and the lists only cost bytes. Titles
derived from field names, defaults, `anyOf: [X, null]` (written `type: [X, "null"]`, or `null` as one
more `enum` value) and the
`type` beside an `enum` go as well.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

_NULL = {"type": "null"}
# Which branch of a union to advertise when the server accepts several: the structured one,
# since the scalar alternatives are named in the description.
_PREFERENCE = ("array", "object", "string", "number", "integer", "boolean")


# ------------------------------------------------------------------------------------------------
# Input schemas
# ------------------------------------------------------------------------------------------------
def portable_input_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The tool's input schema in the subset Gemini, OpenAI and Claude all accept (module doc)."""
    defs = schema.get("$defs", {})
    properties = {name: _portable(prop, defs) for name, prop in (schema.get("properties") or {}).items()}
    out: dict[str, Any] = {"type": "object", "properties": properties}
    required = [r for r in schema.get("required", []) if r in properties]
    if required:
        out["required"] = required
    return out


def _portable(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _deref(node, defs)
    description = node.get("description")
    notes: list[str] = []
    if "anyOf" in node or "oneOf" in node:
        branches = [_deref(b, defs) for b in node.get("anyOf", node.get("oneOf", []))]
        branches = [b for b in branches if b != _NULL]
        branches.sort(key=lambda b: _PREFERENCE.index(b.get("type")) if b.get("type") in _PREFERENCE else 99)
        chosen, others = branches[0], branches[1:]
        for other in others:
            values = other.get("enum") or ([other["const"]] if "const" in other else None)
            if values and not all(f"'{v}'" in (description or "") for v in values):
                notes.append("or " + " / ".join(json.dumps(v) for v in values))
        merged = {**chosen, **{k: v for k, v in node.items() if k not in ("anyOf", "oneOf")}}
        node = merged
    out: dict[str, Any] = {}
    kind = node.get("type")
    if isinstance(kind, list):  # ["string", "null"]
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object" and not node.get("properties"):
        out["type"] = "string"
        notes.append("a JSON object, sent as a string such as '{\"name\": 2}'")
    elif kind == "object":
        out["type"] = "object"
        out["properties"] = {k: _portable(v, defs) for k, v in node["properties"].items()}
        if node.get("required"):
            out["required"] = list(node["required"])
    elif kind is not None:
        out["type"] = kind
    if kind == "array" and "items" in node:
        out["items"] = _portable(node["items"], defs)
    if "const" in node:
        out["enum"] = [node["const"]]
    for key in ("enum", "minimum", "maximum", "minItems", "maxItems", "minLength", "maxLength", "format"):
        if key in node:
            out[key] = node[key]
    if "exclusiveMinimum" in node:
        out["minimum"] = node["exclusiveMinimum"]
        notes.append(f"> {node['exclusiveMinimum']}")
    if "exclusiveMaximum" in node:
        out["maximum"] = node["exclusiveMaximum"]
        notes.append(f"< {node['exclusiveMaximum']}")
    if node.get("default") is not None and "default" not in (description or ""):
        notes.append(f"default {json.dumps(node['default'])}")
    text = "; ".join(filter(None, [description, *notes]))
    if text:
        out["description"] = text
    return out


def _deref(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


# ------------------------------------------------------------------------------------------------
# Output schemas
# ------------------------------------------------------------------------------------------------
def compact_output_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The same constraints in fewer bytes: titles and defaults dropped, nullable types folded."""
    out = _compact(schema)
    if "$defs" in schema:
        out["$defs"] = {name: _compact(d) for name, d in schema["$defs"].items()}
    return out


def _compact(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "default", "$defs", "required") and not isinstance(value, dict):
            continue
        if key == "description" and isinstance(value, str):
            continue
        if key == "properties":
            out[key] = {name: _compact(prop) for name, prop in value.items()}
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            out[key] = [_compact(v) for v in value]
        elif key in ("items", "additionalProperties", "not"):
            out[key] = _compact(value)
        else:
            out[key] = value
    if "enum" in out and isinstance(out.get("type"), str):
        del out["type"]  # the values fix the type
    branches = out.get("anyOf")
    if branches and len(branches) == 2 and _NULL in branches:
        other = branches[0] if branches[1] == _NULL else branches[1]
        if isinstance(other.get("type"), str):
            del out["anyOf"]
            out = {**other, **out, "type": [other["type"], "null"]}
        elif set(other) == {"enum"}:  # a nullable choice: null is one more value
            del out["anyOf"]
            out = {**out, "enum": [*other["enum"], None]}
    return out


# ------------------------------------------------------------------------------------------------
# Validation errors
# ------------------------------------------------------------------------------------------------
def explain_invalid_arguments(error: ValidationError, tool: str, schema: dict[str, Any] | None) -> str:
    """One line per bad argument: its name, what was wrong, and what it accepts. No docs URLs."""
    properties = (schema or {}).get("properties", {})
    lines = []
    for err in error.errors(include_url=False):
        loc = [str(part) for part in err.get("loc", ()) if not isinstance(part, int)]
        name = loc[0] if loc else None
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if name is None or name not in properties:
            lines.append(f"{message}" if name is None else f"{'.'.join(loc)}: {message}")
            continue
        got = err.get("input")
        shown = json.dumps(got)[:80] if _jsonable(got) else repr(got)[:80]
        lines.append(f"{name}: {message} (got {shown}); accepts {accepts(properties[name])}")
    return f"invalid arguments for {tool}: " + " | ".join(lines)


def accepts(prop: dict[str, Any]) -> str:
    """A short phrase for what a portable property schema accepts."""
    kind = prop.get("type")
    if "enum" in prop:
        text = "one of " + ", ".join(json.dumps(v) for v in prop["enum"])
    elif kind == "array":
        item = prop.get("items", {}).get("type", "value")
        text = f"a list of {item}s (or the list as a JSON string, e.g. '[1, 2]')"
    elif kind == "integer" or kind == "number":
        said = prop.get("description") or ""  # an exclusive bound is noted there as "> 0"
        low = "minimum" in prop and (">" if f"> {prop['minimum']}" in said else ">=")
        high = "maximum" in prop and ("<" if f"< {prop['maximum']}" in said else "<=")
        bounds = [f"{low} {prop['minimum']}" if low else "", f"{high} {prop['maximum']}" if high else ""]
        text = f"{'an integer' if kind == 'integer' else 'a number'} {' and '.join(b for b in bounds if b)}".strip()
    elif kind == "boolean":
        text = "true or false"
    elif kind == "string":
        text = "a string"
    else:
        text = "a value"
    description = prop.get("description")
    return f"{text} ({description})" if description else text


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True

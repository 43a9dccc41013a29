"""The Skills extension (io.modelcontextprotocol/skills) on every protocol version clients speak.

Use it from the server: `MCPServer(..., extensions=[SkillsExtension(pack)],
middleware=[DeclareSkillsOnHandshake()])`.

- `SkillsExtension` serves `skills/list` and `skills/get` from the SkillPack that also backs
  the skill:// resources. The SDK advertises it under `capabilities.extensions` only to clients
  that negotiate 2026-07-28 (`server/discover`).
- `DeclareSkillsOnHandshake` adds the declaration to the `initialize` result of the handshake
  versions (2024-11-05 to 2025-11-25), whose schemas have no `extensions` field and whose
  results the SDK sieves: under `capabilities.experimental[identifier]` always (the field
  every one of those versions defines for non-standard capabilities), and under
  `capabilities.extensions[identifier]` when the client's own capabilities carried an
  `extensions` object (it speaks SEP-2133 extension negotiation on an older wire, as MCP
  Inspector and the ext-skills reference client do, and reads the declaration there).

Known limitations: skills/list returns every skill on one page (nine skills, about 10 KB), so
any `cursor` is unknown to it and refused with -32602; `ttlMs`/`cacheScope`/`resultType` are
sent on 2026-07-28 only, the versions whose schema defines them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, RequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from torch_skills.skillpack.loader import ROUTER_NAME, SkillPack, SkillPathError, UnknownSkill

SKILLS_EXTENSION = "io.modelcontextprotocol/skills"
SKILLS_SETTINGS: dict[str, Any] = {}  # no optional features (directoryRead is not implemented)
LISTING_TTL_MS = 300_000  # the pack is read once at start-up; five minutes is a safe freshness hint


class ListSkillsParams(RequestParams):
    cursor: str | None = None


class GetSkillParams(RequestParams):
    # Optional here so that a request without it gets an error naming the field, not the
    # SDK's generic "Invalid request parameters".
    uri: Any = None


class SkillsExtension(Extension):
    """Serves `skills/list` and `skills/get` from the same SkillPack as the resources."""

    identifier = SKILLS_EXTENSION

    def __init__(self, pack: SkillPack):
        self.pack = pack

    def settings(self) -> dict[str, Any]:
        return dict(SKILLS_SETTINGS)

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("skills/list", ListSkillsParams, self._list),
            MethodBinding("skills/get", GetSkillParams, self._get),
        )

    async def _list(self, ctx: ServerRequestContext[Any, Any], params: ListSkillsParams) -> dict[str, Any]:
        if params.cursor is not None:
            raise MCPError(
                INVALID_PARAMS,
                f"unknown cursor {params.cursor!r}: skills/list returns every skill on one page and "
                "never issues a nextCursor; call it without a cursor",
            )
        skills = [self.pack.entry(name) for name in self.pack.skills]
        return _cacheable(ctx, {"skills": skills})

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: GetSkillParams) -> dict[str, Any]:
        example = f"skill://{ROUTER_NAME}/SKILL.md"
        if params.uri is None:
            raise MCPError(
                INVALID_PARAMS,
                f"skills/get: missing required field 'uri' (the URI of a SKILL.md, e.g. {example})",
            )
        if not isinstance(params.uri, str):
            raise MCPError(INVALID_PARAMS, f"skills/get: 'uri' must be a string such as {example}")
        try:
            name, path = self.pack.parse_uri(params.uri)
            if path != "SKILL.md":
                raise SkillPathError(
                    f"{params.uri!r} is not the URI of a SKILL.md (e.g. skill://{name}/SKILL.md)"
                )
            entry = self.pack.entry(name)
        except (SkillPathError, UnknownSkill) as e:
            raise MCPError(INVALID_PARAMS, f"no skill is served at {params.uri}: {e}") from None
        return _cacheable(ctx, {"skill": entry})


def _cacheable(ctx: ServerRequestContext[Any, Any], result: dict[str, Any]) -> dict[str, Any]:
    """Add the caching attributes on the protocol versions that define them (2026-07-28 on)."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return {"resultType": "complete", **result, "ttlMs": LISTING_TTL_MS, "cacheScope": "public"}
    return result


class DeclareSkillsOnHandshake:
    """Server middleware: declare the Skills extension in `initialize` results (see module doc)."""

    def __init__(self, identifier: str = SKILLS_EXTENSION, settings: dict[str, Any] | None = None):
        self.identifier = identifier
        self.settings = dict(SKILLS_SETTINGS if settings is None else settings)

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        result = await call_next(ctx)
        if ctx.method != "initialize" or not isinstance(result, dict):
            return result
        return declare_in_initialize_result(result, ctx.params, self.identifier, self.settings)


def declare_in_initialize_result(
    result: dict[str, Any], client_params: Any, identifier: str, settings: dict[str, Any]
) -> dict[str, Any]:
    """A copy of a wire `initialize` result that declares `identifier` where the client can see it."""
    capabilities = dict(result.get("capabilities") or {})
    experimental = dict(capabilities.get("experimental") or {})
    experimental[identifier] = dict(settings)
    capabilities["experimental"] = experimental
    client_capabilities = client_params.get("capabilities") if isinstance(client_params, Mapping) else None
    if isinstance(client_capabilities, Mapping) and isinstance(
        client_capabilities.get("extensions"), Mapping
    ):
        extensions = dict(capabilities.get("extensions") or {})
        extensions[identifier] = dict(settings)
        capabilities["extensions"] = extensions
    return {**result, "capabilities": capabilities}

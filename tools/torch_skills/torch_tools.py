"""The MCP tools that run the user's code, declared once each.

Use it from the server: `register_torch_tool(mcp, TorchTool(name=..., request=..., result=...,
worker=..., description=...))`. A tool's arguments are the fields of its request model (a
`ModelInputs` subclass in `torch_skills/<tool>/models.py`): the shared user-code contract
(`model`, `model_kwargs`, `inputs`, `input_shape`, `input_dtype`, `loss`, `device`) is declared
there once, each tool's own options beside it, so the schema a client sees is the model's fields
with their descriptions and bounds (in the portable form of `wire_schema`), plus the run limits
every tool takes (`timeout_s`, `memory_limit_gib`). Adding a tool is a request model, a result
model, a worker function and one `TorchTool(...)`.

The generated function accepts what clients really send (`lenient`: lists and objects as JSON
strings, a bare name for a list of names), refuses the rest with one clause per argument saying
what it accepts, checks every path the request names against the allowed roots (asking the
client for its MCP roots only when a path lies outside the server's), runs the worker in a fresh
child of the warm worker pool while a heartbeat keeps the client's timeout from firing, and
validates the answer into the result model.

Known limitations: request fields whose default is a factory (`model_kwargs`) are optional with
no default in the schema; None means "the model's default" for every field.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from mcp.server.mcpserver import Context, ListRoots, MCPServer, Resolve
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ListRootsResult, ToolAnnotations
from pydantic import BaseModel, BeforeValidator, Field, ValidationError
from pydantic.fields import FieldInfo

from torch_skills.heartbeat import Heartbeat
from torch_skills.refpolicy import ROLES, check_model_kwargs, check_reference
from torch_skills.roots import AllowedRoots, PathNotAllowed
from torch_skills.runner.errors import WorkerError
from torch_skills.skillpack.loader import SkillPathError, UnknownSkill
from torch_skills.userspec import CodeRef, CodeRefError
from torch_skills.wire import wire_safe, wire_safe_value
from torch_skills.wire_schema import explain_invalid_arguments, portable_input_schema

if TYPE_CHECKING:
    from torch_skills.server import ServerState

# Errors the model can fix by calling differently: their message reaches it as a tool error.
ANTICIPATED = (SkillPathError, UnknownSkill, PathNotAllowed, CodeRefError, WorkerError, ValidationError)


@contextlib.contextmanager
def anticipated_errors() -> Iterator[None]:
    """Re-raise the errors above as ToolError, so the SDK passes their message (the next step) on."""
    try:
        yield
    except WorkerError as e:
        raise ToolError(f"[{e.kind}] {e}") from None
    except ANTICIPATED as e:
        raise ToolError(str(e)) from None


# Tool annotations: the torch tools run code but change nothing outside their own temp folder...
RUNS_USER_CODE = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
# ...except profile_model, which may write a trace file (never over an existing one).
RUNS_USER_CODE_WRITES_TRACE = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, open_world_hint=False
)

# The run limits every torch tool takes besides its request fields.
MemoryArg = Annotated[float | None, Field(gt=0, description="RAM cap in GiB (default: the server's cap)")]


@dataclass(frozen=True)
class TorchTool:
    """One tool that runs user code: its request/result models, worker function and description."""

    name: str
    request: type[BaseModel]  # a ModelInputs subclass: its fields are the tool's arguments
    result: type[BaseModel]  # validated from the worker's dict; has a `run: RunInfo | None` field
    worker: str  # 'torch_skills.<tool>.worker:run'
    description: str
    timeout_s: float = 120.0  # default of the tool's timeout_s argument
    path_arguments: tuple[str, ...] = ("model", "inputs", "loss")  # may name files outside the roots
    hidden: tuple[str, ...] = ()  # request fields not offered to clients (internal knobs)
    annotations: ToolAnnotations = field(default_factory=lambda: RUNS_USER_CODE)


def lenient(annotation: Any) -> Callable[[Any], Any]:
    """A before-validator for a tool argument of type `annotation` that takes what clients send.

    Some clients send every list or object argument as a JSON string ('["Block"]',
    '{"layers": 2}', '[8, 16]'), or a bare name where a list of names is expected ("Block"):
    those become the list or object. Anything else is left for validation to accept or refuse.
    """
    structured = _origins(annotation) & {list, dict}
    literals = set(_literal_values(annotation))

    def coerce(value: Any) -> Any:
        if not structured or not isinstance(value, str) or value in literals:
            return value
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if isinstance(parsed, (list, dict)):
            return parsed
        if list in structured and value.strip() and parsed is None:
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    return coerce


def _origins(annotation: Any) -> set[Any]:
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) or origin is typing.Annotated:
        return set().union(*(_origins(a) for a in args))
    return {origin or annotation}


def _literal_values(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return list(typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return [v for a in typing.get_args(annotation) for v in _literal_values(a)]
    return []


def _argument(name: str, field: FieldInfo) -> inspect.Parameter:
    """A keyword parameter carrying the request field's type, bounds and description."""
    annotation: Any = field.annotation
    metadata = [*field.metadata, BeforeValidator(lenient(annotation)), Field(description=field.description)]
    if field.is_required():
        return inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[(annotation, *metadata)]
        )
    default = field.get_default(call_default_factory=False)
    if field.default_factory is not None:
        annotation, default = annotation | None, None
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[(annotation, *metadata)]
    )


def client_roots_when_needed(*path_arguments: str) -> Any:
    """An `Annotated[ListRootsResult, Resolve(...)]` type for a tool parameter: the client's MCP roots.

    The resolver asks the client for its roots only when one of the named path arguments lies
    outside the server's own roots and the client declared the roots capability; otherwise it
    returns an empty list without a round trip. The SDK carries the request either way the
    negotiated protocol wants (an input-required round on 2026-07-28, roots/list before).
    """

    def resolve(ctx: Context, **arguments: str | None) -> ListRoots | ListRootsResult:
        caps = ctx.client_capabilities
        if caps is None or caps.roots is None:
            return ListRootsResult(roots=[])
        state: ServerState = ctx.request_context.lifespan_context
        for value in arguments.values():
            path = _path_in(value) if isinstance(value, str) else None
            if path is not None and not state.roots.contains(path):
                return ListRoots()
        return ListRootsResult(roots=[])

    parameters = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
    parameters += [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=str | None)
        for name in path_arguments
    ]
    resolve.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    resolve.__annotations__ = {
        "ctx": Context,
        **{name: str | None for name in path_arguments},
        "return": ListRoots | ListRootsResult,
    }
    resolve.__name__ = resolve.__qualname__ = f"client_roots_for_{'_'.join(path_arguments)}"
    return Annotated[ListRootsResult, Resolve(resolve)]


def _path_in(value: str) -> str | None:
    """The file a tool argument points at: 'models.py:build' -> 'models.py'; a plain path as is."""
    try:
        ref = CodeRef.parse(value)
    except CodeRefError:
        return value
    return ref.path


def tool_function(tool: TorchTool) -> Callable[..., Any]:
    """The async function MCPServer registers for `tool`: its signature is the tool's schema."""
    fields = {n: f for n, f in tool.request.model_fields.items() if n not in tool.hidden}
    arguments = [_argument(n, f) for n, f in fields.items()]
    arguments.sort(key=lambda p: p.default is not inspect.Parameter.empty)  # required ones first
    limits = [
        inspect.Parameter(
            "timeout_s",
            inspect.Parameter.KEYWORD_ONLY,
            default=tool.timeout_s,
            annotation=Annotated[
                float, Field(gt=0, le=3600, description="seconds before the run is stopped")
            ],
        ),
        inspect.Parameter(
            "memory_limit_gib", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=MemoryArg
        ),
    ]
    roots_type = client_roots_when_needed(*[a for a in tool.path_arguments if a in fields])
    injected = [
        inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context),
        inspect.Parameter(
            "client_roots", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=roots_type
        ),
    ]

    async def call(
        ctx: Context,
        client_roots: ListRootsResult | None = None,
        timeout_s: float = tool.timeout_s,
        memory_limit_gib: float | None = None,
        **given: Any,
    ) -> Any:
        try:
            request = tool.request.model_validate({k: v for k, v in given.items() if v is not None})
        except ValidationError as e:
            raise ToolError(explain_invalid_arguments(e, tool.name, _request_schema(tool.request))) from None
        result = await run_in_worker(
            ctx,
            tool.worker,
            request,
            timeout_s=timeout_s,
            memory_limit_gib=memory_limit_gib,
            device=str(getattr(request, "device", "auto")),
            check_paths=request.named_paths(),  # type: ignore[attr-defined]
            client_roots=client_roots,
            label=tool.name,
        )
        with anticipated_errors():  # made wire-safe here: the SDK serializes the model before any middleware
            return tool.result.model_validate(wire_safe_value(result))

    parameters = arguments + limits + injected
    call.__signature__ = inspect.Signature(parameters, return_annotation=tool.result)  # type: ignore[attr-defined]
    call.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": tool.result}
    call.__name__ = call.__qualname__ = tool.name
    call.__doc__ = tool.description
    return call


@functools.cache
def _request_schema(request: type[BaseModel]) -> dict[str, Any]:
    """The request model's fields as tools/list shows them, for naming what an argument accepts."""
    return portable_input_schema(request.model_json_schema())


def register_torch_tool(mcp: MCPServer, tool: TorchTool) -> None:
    """Add `tool` to the server under its name, with its description and annotations."""
    mcp.tool(name=tool.name, description=tool.description, annotations=tool.annotations)(tool_function(tool))


def check_references(request: BaseModel, roots: AllowedRoots) -> None:
    """The reference rule, before any worker starts (`torch_skills.refpolicy`): every code
    reference the request names by its role, and model_kwargs (against the listed factory's entry
    when `model` names one). The worker checks again after the import, before the call."""
    factory = None
    for role in ROLES:
        value = getattr(request, role, None)
        if isinstance(value, str):
            found = check_reference(CodeRef.parse(value), role, cwd=roots.cwd)
            factory = found if role == "model" else factory
    kwargs = getattr(request, "model_kwargs", None)
    if kwargs:
        check_model_kwargs(kwargs, roots.cwd, roots.all, factory)


def names_project_code(request: BaseModel) -> bool:
    """Whether the request names code (model, inputs, loss, data, function): only such a call starts
    the project's interpreter; one that names only files runs under the server's own."""
    return any(getattr(request, role, None) is not None for role in ROLES)


# Worker functions with a torch-free variant, for files-only calls on a server installed without torch.
WITHOUT_TORCH = {"torch_skills.checkpoint.worker:run": "torch_skills.checkpoint.static_only:run"}


async def run_in_worker(
    ctx: Context,
    fn: str,
    request: BaseModel,
    *,
    timeout_s: float,
    memory_limit_gib: float | None,
    device: str = "auto",
    check_paths: Sequence[str] = (),
    client_roots: ListRootsResult | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    """Run a tool function in a fresh worker child; return its result dict with `run` facts filled in.

    While the job waits or runs, the client gets a progress notification at least every
    `state.heartbeat_s` seconds (`torch_skills.heartbeat`), merged with the worker's phase
    reports, under the name `label`.

    Every path the request names must be in `check_paths`: they are checked here, before any code
    runs, against the server's roots plus `client_roots` (from `client_roots_when_needed`), and so
    are its code references and model_kwargs (`check_references`).
    Raises ToolError with the next step on failure.
    """
    state: ServerState = ctx.request_context.lifespan_context
    roots = state.roots
    if client_roots is not None and client_roots.roots:
        roots = roots.with_client_roots([str(r.uri) for r in client_roots.roots])
    with anticipated_errors():
        for path in check_paths:
            roots.check(path)
        check_references(request, roots)

    async def progress(done: float, total: float | None, message: str | None) -> None:
        await ctx.report_progress(done, total, wire_safe(message) if message is not None else None)

    pool = state.pool if names_project_code(request) else state.own_pool
    if pool.without_torch:  # installed without torch: the torch-free variant (the worker refuses others)
        fn = WITHOUT_TORCH.get(fn, fn)
    limit = int(memory_limit_gib * 2**30) if memory_limit_gib else state.memory_limit_bytes
    async with Heartbeat(progress, label=label or fn, interval_s=state.heartbeat_s) as beat:
        # One notification at once, so every call reports progress however fast it ends (a client
        # that asked for progress may treat a silent call as stuck); the pool says so when it waits.
        await beat.phase(0, None, "starting a worker process")
        with anticipated_errors():
            job = await pool.run(
                fn,
                request,
                timeout_s=timeout_s,
                memory_limit_bytes=limit,
                device=device,
                cwd=roots.base,
                allowed_roots=list(roots.all),
                on_progress=beat.phase,
            )
    result = dict(job.result)
    result["run"] = {
        "device": job.device,
        "torch_version": job.torch_version,
        "python": job.python,
        "cpu_threads": job.cpu_threads,
        "wall_time_s": job.wall_time_s,
        "output": job.output,
        "output_bytes": job.output_bytes,
        "output_truncated": job.output_truncated,
    }
    return result

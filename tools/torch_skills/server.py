"""torch-skills MCP server: the wiring of skills, prompts and tools onto an MCPServer.

Use `build_server()` (tests: `Client(build_server())`); the command line is `torch_skills.cli`
(`torch-skills`, `python server.py` in a clone). Skills come from the package's `skills/` (one
source for the Skills extension, the skill:// resources, the list_skills/get_skill tools, the
prompts and `route`); the torch tools are declared in `TORCH_TOOLS` and run in worker processes
(`torch_skills.runner`), never here. torch is never imported by this process.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError, UnexpectedToolError
from mcp.server.mcpserver.prompts.base import Prompt
from mcp.server.mcpserver.resources import FunctionResource
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, TextContent, ToolAnnotations
from mcp_types import Tool as MCPTool
from pydantic import BaseModel, Field, ValidationError

from torch_skills import __version__
from torch_skills.checkpoint.models import VerifyCheckpointRequest, VerifyCheckpointResult
from torch_skills.distributed.models import DistributedRequest, DistributedResult
from torch_skills.gradients.models import GradientRequest, GradientResult
from torch_skills.heartbeat import DEFAULT_INTERVAL_S as DEFAULT_HEARTBEAT_S
from torch_skills.memory.models import EstimateMemoryRequest, EstimateMemoryResult
from torch_skills.profiling.models import ProfileRequest, ProfileResult
from torch_skills.roots import AllowedRoots
from torch_skills.runner.interpreter import find_interpreter
from torch_skills.runner.pool import WorkerPool, default_memory_limit_bytes
from torch_skills.skillpack.loader import (
    DEFAULT_SKILLS_DIR,
    ROUTER_NAME,
    SkillPack,
    SkillPathError,
    UnknownSkill,
    mime_type_for,
)
from torch_skills.skillpack.pages import continuation_note, text_page
from torch_skills.skillpack.route import Router, RouteResult
from torch_skills.skillpack.router import RouterFormatError, parse_router
from torch_skills.skills_extension import DeclareSkillsOnHandshake, SkillsExtension
from torch_skills.torch_tools import (
    RUNS_USER_CODE_WRITES_TRACE,
    TorchTool,
    anticipated_errors,
    register_torch_tool,
)
from torch_skills.wire import install_wire_safety
from torch_skills.wire_schema import compact_output_schema, explain_invalid_arguments, portable_input_schema

log = logging.getLogger("torch-skills")

INSTRUCTIONS = f"""\
PyTorch engineering help. Start with the router skill skill://{ROUTER_NAME}/SKILL.md: it maps a
symptom (out of memory, NaN loss, slow steps, DDP hangs, checkpoint errors...) to one of eight
specialist skills. When unsure where a question belongs, call `route` with the user's words or
the pasted error. It also says when a question needs one clarifying question first or is not PyTorch
engineering (`status`). Diagnose before fixing: the tools run on the user's own code in a sandboxed
worker - `check_gradients` (NaN/Inf source, dead or exploding gradients, gradcheck),
`estimate_memory` (peak memory before running on a GPU), `profile_model` (what bounds a step),
`verify_checkpoint` (is a checkpoint safe, complete, does it fit the model), `check_distributed`
(run the step on 2-8 real DDP/FSDP ranks: unused parameters, mismatched collectives, diverging
replicas, gradient scale, data sharding). Models are given as
'path/to/file.py:factory'. Clients without the Skills extension can use `list_skills` and
`get_skill`."""

# Seconds after start-up before the torch worker is started. 0: its `import torch` runs on the
# other core while the handshake and tools/list are answered, and the first tool call waits for
# torch only, not for the other tool modules (runner/zygote.py); bench/startup.py measures both.
PREWARM_DELAY_S = 0.0

# Modules the warm worker imports before forking, so every call starts with them loaded.
WORKER_PRELOAD = (
    "torch_skills.runner.usercode",
    "torch_skills.gradients.worker",
    "torch_skills.checkpoint.worker",
    "torch_skills.memory.worker",
    "torch_skills.profiling.worker",
    "torch_skills.distributed.worker",
)


# ------------------------------------------------------------------------------------------------
# Results of the skill tools
# ------------------------------------------------------------------------------------------------
class SkillSummary(BaseModel):
    name: str
    description: str
    uri: str = Field(description="skill:// URI of its SKILL.md, readable as a resource")
    files: list[str] = Field(description="every file of the skill, relative to its folder")


class SkillList(BaseModel):
    skills: list[SkillSummary]
    start_with: str = Field(description="the router skill to read first")


class SkillText(BaseModel):
    name: str
    path: str
    uri: str
    text: str = Field(description="the file's text from `offset`, at most one page (about 20,000 tokens)")
    offset: int = Field(default=0, description="the character this page starts at")
    next_offset: int | None = Field(
        default=None, description="call again with this offset for the next page; null on the last page"
    )
    total_chars: int = Field(default=0, description="the whole file's length in characters")


# ------------------------------------------------------------------------------------------------
# Protocol errors the spec names
# ------------------------------------------------------------------------------------------------
class TorchSkillsServer(MCPServer):
    """MCPServer with the wire details clients depend on (the SDK's defaults differ):

    - tools/list carries portable input schemas and compact output schemas (`wire_schema`);
    - a tool call with bad arguments fails with one line per argument saying what it accepts;
    - a tool result's text content is compact JSON (the structured content is unchanged);
    - `prompts/get` fails with -32602 (Invalid params) and a message saying what to send, for an
      unknown prompt name or a missing required argument, as the spec asks; the SDK answers
      those with a generic error and logs a traceback.
    """

    _wire_tools: tuple[tuple[str, ...], list[MCPTool]] = ((), [])

    async def list_tools(self) -> list[MCPTool]:
        tools = await super().list_tools()
        names = tuple(t.name for t in tools)
        if self._wire_tools[0] != names:  # rewritten once, again only if the tool set changes
            self._wire_tools = (names, [_wire_tool(t) for t in tools])
        return self._wire_tools[1]

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> Any:
        try:
            result = await super().call_tool(name, arguments, context)
        except ToolError as e:
            if isinstance(e.__cause__, ValidationError) and not isinstance(e, UnexpectedToolError):
                schemas = {t.name: t.input_schema for t in await self.list_tools()}
                raise ToolError(
                    explain_invalid_arguments(e.__cause__, name, schemas.get(name))
                ) from e.__cause__
            raise
        if isinstance(result, CallToolResult) and result.structured_content is not None:
            text = [c for c in result.content if isinstance(c, TextContent)]
            if len(text) == 1 and len(result.content) == 1:
                compact = json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False)
                result = result.model_copy(update={"content": [TextContent(type="text", text=compact)]})
        return result

    async def get_prompt(
        self, name: str, arguments: dict[str, Any] | None = None, context: Context[Any, Any] | None = None
    ) -> Any:
        prompts = {p.name: p for p in await self.list_prompts()}
        prompt = prompts.get(name)
        if prompt is None:
            raise MCPError(INVALID_PARAMS, f"unknown prompt {name!r}; the prompts are: {', '.join(prompts)}")
        given = arguments or {}
        missing = [a.name for a in prompt.arguments or () if a.required and given.get(a.name) in (None, "")]
        if missing:
            raise MCPError(
                INVALID_PARAMS,
                f"prompt {name!r} needs the argument(s) {', '.join(repr(m) for m in missing)}: "
                + "; ".join(
                    f"{a.name}: {a.description}" for a in prompt.arguments or () if a.name in missing
                ),
            )
        unknown = sorted(set(given) - {a.name for a in prompt.arguments or ()})
        if unknown:
            raise MCPError(
                INVALID_PARAMS,
                f"prompt {name!r} takes no argument(s) {', '.join(map(repr, unknown))}; "
                f"it takes: {', '.join(a.name for a in prompt.arguments or ())}",
            )
        return await super().get_prompt(name, given, context)


def _wire_tool(tool: MCPTool) -> MCPTool:
    """A tool as tools/list sends it: dedented description, portable input, compact output schema."""
    return tool.model_copy(
        update={
            "description": inspect.cleandoc(tool.description or ""),
            "input_schema": portable_input_schema(tool.input_schema),
            "output_schema": tool.output_schema and compact_output_schema(tool.output_schema),
        }
    )


# ------------------------------------------------------------------------------------------------
# Server state shared by the tool calls
# ------------------------------------------------------------------------------------------------
@dataclass
class ServerState:
    pack: SkillPack
    roots: AllowedRoots
    pool: WorkerPool  # runs calls that name project code, under the project's interpreter
    memory_limit_bytes: int
    # Runs calls that name only files (verify_checkpoint without model) under the server's own
    # interpreter: `pool` itself when that is the project's; one started --without-torch when the
    # server has no torch (`torch_tools.WITHOUT_TORCH`).
    own_pool: WorkerPool
    heartbeat_s: float = DEFAULT_HEARTBEAT_S  # longest silence during a torch-tool call, seconds


# ------------------------------------------------------------------------------------------------
# Building the server
# ------------------------------------------------------------------------------------------------
def build_server(
    skills_dir: Path = DEFAULT_SKILLS_DIR,
    *,
    allow: Sequence[Path] = (),
    max_jobs: int = 2,
    prewarm: bool = True,
    memory_limit_gib: float | None = None,
    heartbeat_s: float | None = None,
    torch_tools: Sequence[TorchTool] | None = None,
    python: str | None = None,
) -> MCPServer:
    """The configured MCPServer. Tests use `Client(build_server())`; `main()` runs it.

    `heartbeat_s`: the longest a torch-tool call goes without a progress notification (default:
    the TORCH_SKILLS_HEARTBEAT_S environment variable, else 5 s). `torch_tools`: the tools that
    run user code (default `TORCH_TOOLS`; tests add their own). `python` is the interpreter the
    user's code runs under (a path, or an environment folder); None finds it from VIRTUAL_ENV, a
    .venv/venv in the working directory (never an --allow root), or CONDA_PREFIX, else the server's
    own (torch_skills.runner.interpreter). A bad path raises InterpreterError.

    The project's interpreter starts only for a call that names project code (`model`, `inputs`,
    `loss`, `data`, `function`); `prewarm` starts it early only when it was not found in a folder
    (--python, the environment, or the server's own). A call that names only files runs under the
    server's own interpreter, or from the static scan alone when that has no torch.
    """
    heartbeat = heartbeat_s if heartbeat_s is not None else _heartbeat_from_env()
    pack = SkillPack.load(skills_dir)
    roots = AllowedRoots(Path.cwd(), tuple(Path(p) for p in allow))
    worker_python = find_interpreter(python, cwd=roots.cwd)
    log.info("user code runs under %s", worker_python.describe())
    own_has_torch = server_has_torch()
    memory_limit = int(memory_limit_gib * 2**30) if memory_limit_gib else default_memory_limit_bytes(max_jobs)

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[ServerState]:
        async with contextlib.AsyncExitStack() as stack:
            pool = await stack.enter_async_context(
                WorkerPool(
                    max_concurrent=max_jobs,
                    preload=WORKER_PRELOAD,
                    python=str(worker_python.executable),
                    python_source=worker_python.source,
                )
            )
            own_pool: WorkerPool = pool
            if not own_has_torch:  # files-only calls get the static scan from a worker without torch
                own_pool = await stack.enter_async_context(
                    WorkerPool(max_concurrent=max_jobs, without_torch=True)
                )
            elif not worker_python.is_server:
                own_pool = await stack.enter_async_context(
                    WorkerPool(max_concurrent=max_jobs, preload=WORKER_PRELOAD)
                )
            if prewarm and not worker_python.found_in_folder:  # a detected one runs only when asked
                pool.prewarm(delay_s=PREWARM_DELAY_S)
            yield ServerState(pack, roots, pool, memory_limit, own_pool, heartbeat_s=heartbeat)

    mcp = TorchSkillsServer(
        "torch-skills",
        title="PyTorch engineering skills",
        instructions=INSTRUCTIONS,
        version=__version__,
        extensions=[SkillsExtension(pack)],
        middleware=[DeclareSkillsOnHandshake()],
        lifespan=lifespan,
    )
    install_wire_safety(mcp)  # every string leaving the server is valid UTF-8
    _register_skill_resources(mcp, pack)
    _register_skill_tools(mcp, pack)
    _register_route(mcp, pack)
    _register_prompts(mcp, pack)
    for tool in TORCH_TOOLS if torch_tools is None else torch_tools:
        register_torch_tool(mcp, tool)
    return mcp


def server_has_torch() -> bool:
    """Whether the server's own environment has torch: located by the import system, never imported."""
    return importlib.util.find_spec("torch") is not None


def _heartbeat_from_env() -> float:
    raw = os.environ.get("TORCH_SKILLS_HEARTBEAT_S")
    if not raw:
        return DEFAULT_HEARTBEAT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value <= 60:
        raise ValueError(f"TORCH_SKILLS_HEARTBEAT_S must be a number of seconds in (0, 60], got {raw!r}")
    return value


def _register_skill_resources(mcp: MCPServer, pack: SkillPack) -> None:
    for skill in pack.skills.values():
        for file in skill.files:

            def read(name: str = skill.name, path: str = file.path) -> str | bytes:
                try:
                    data = pack.read(name, path)
                except (SkillPathError, UnknownSkill) as e:  # the file went away since start-up
                    raise ResourceNotFoundError(str(e)) from None
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    return data
                page = text_page(text)  # a long file: its first page and where the rest is
                return (
                    page.text if page.next_offset is None else page.text + continuation_note(name, path, page)
                )

            mcp.add_resource(
                FunctionResource(
                    uri=skill.uri(file.path),
                    name=skill.name if file.path == "SKILL.md" else f"{skill.name}/{file.path}",
                    description=skill.description if file.path == "SKILL.md" else None,
                    mime_type=mime_type_for(file.path),
                    fn=read,
                )
            )


def _register_skill_tools(mcp: MCPServer, pack: SkillPack) -> None:
    read_only = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)

    @mcp.tool(annotations=read_only)
    def list_skills() -> SkillList:
        """List the PyTorch skills: name, what each covers and when to use it, its URI and files.

        Read the router (using-pytorch-engineering) first; it says which specialist fits a symptom."""
        return SkillList(
            skills=[
                SkillSummary(
                    name=s.name, description=s.description, uri=s.uri(), files=[f.path for f in s.files]
                )
                for s in pack.skills.values()
            ],
            start_with=ROUTER_NAME,
        )

    @mcp.tool(annotations=read_only)
    def get_skill(
        name: Annotated[str, Field(description="skill name, e.g. 'debugging-techniques'")],
        path: Annotated[
            str, Field(description="file inside the skill, e.g. 'references/nan-search.md'")
        ] = "SKILL.md",
        offset: Annotated[
            int, Field(ge=0, description="character to start at: the `next_offset` of the previous page")
        ] = 0,
    ) -> SkillText:
        """Read one file of a skill (its SKILL.md by default, or a file under references/), one page
        of about 20,000 tokens at a time: when `next_offset` is set, call again with it for the rest."""
        with anticipated_errors():
            data = pack.read(name, path)
        text = data.decode("utf-8", "replace")
        try:
            page = text_page(text, offset)
        except ValueError as e:
            raise ToolError(f"{e}: pass offset=0 or the next_offset of the previous page") from None
        return SkillText(
            name=name,
            path=path,
            uri=pack.get(name).uri(path),
            text=page.text,
            offset=page.offset,
            next_offset=page.next_offset,
            total_chars=page.total_chars,
        )


def _register_route(mcp: MCPServer, pack: SkillPack) -> None:
    router = functools.cache(lambda: Router.from_pack(pack))  # parsed on the first call, not at start-up

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False))
    def route(
        query: Annotated[
            str, Field(description="the user's symptom, question or pasted error message, verbatim")
        ],
    ) -> RouteResult:
        """Say which PyTorch skill to read for a symptom or error, the one question to ask first, or that the
        question is out of scope.

        `status`: "routed" (read `skills` in order; run `tools` on the user's code), "clarify" (no
        symptom named: ask the user `clarify`, then route again) or "out_of_scope" (not PyTorch
        engineering, e.g. TensorFlow, JAX, pandas, scikit-learn, driver installs, ML theory: tell the
        user `reason`). Also `evidence` (matched router phrases), `confidence` and `ignored_lines`
        (pasted collect_env or issue-template lines). Pass the user's words verbatim."""
        return router().route(query)


PROMPT_TEXT = """\
Use the PyTorch skill `{{ name }}` for this problem. Read skill://{{ name }}/SKILL.md first (or call
get_skill("{{ name }}")) and follow it: diagnose before changing code
{%- if tools %}, starting with the {{ tools | join(" / ") }} tool on my code{% endif %}, then propose the
smallest fix and say how to confirm it worked.

My problem: {{ problem }}"""


@functools.cache
def _prompt_template() -> Any:
    import jinja2  # only when a prompt is rendered: keeps start-up lean

    return jinja2.Template(PROMPT_TEXT, undefined=jinja2.StrictUndefined)


def _prompt_renderer(name: str, tools_by_skill: Callable[[], dict[str, list[str]]]):
    def render(
        problem: Annotated[
            str, Field(description="the symptom, error message or question, in your own words")
        ],
    ) -> str:
        return _prompt_template().render(name=name, tools=tools_by_skill().get(name, []), problem=problem)

    return render


def _register_prompts(mcp: MCPServer, pack: SkillPack) -> None:
    tools_by_skill = functools.cache(lambda: skill_tools(pack))  # the router is parsed on first use
    for skill in pack.skills.values():
        if skill.name == ROUTER_NAME:
            continue
        mcp.add_prompt(
            Prompt.from_function(
                _prompt_renderer(skill.name, tools_by_skill),
                name=skill.name,
                title=skill.name.replace("-", " ").capitalize(),
                description=skill.description,
            )
        )


def skill_tools(pack: SkillPack) -> dict[str, list[str]]:
    """Diagnostic tool named by each route section of the router (skill -> [tool])."""
    if ROUTER_NAME not in pack.skills:
        return {}
    try:
        table = parse_router(pack.skills[ROUTER_NAME].body)
    except RouterFormatError:
        return {}
    return {name: section.tools for name, section in table.routes.items() if section.tools}


# ------------------------------------------------------------------------------------------------
# The tools that run the user's code: arguments are their request models' fields (torch_tools.py)
# ------------------------------------------------------------------------------------------------
TORCH_TOOLS = (
    TorchTool(
        name="check_gradients",
        request=GradientRequest,
        result=GradientResult,
        worker="torch_skills.gradients.worker:run",
        path_arguments=("model", "function", "inputs", "loss"),
        hidden=("thresholds",),
        description="""Run one forward + backward on the user's model and say what is wrong with its gradients.

Finds where the first NaN/Inf is created (module, op, source line; forward, loss or backward,
with the autograd node), parameters that get no gradient and why (branch never run, detach,
no_grad), exploding/vanishing gradients by layer depth, dead ReLUs, and per-parameter grad and
weight norms. With `function` instead of `model` it runs torch.autograd.gradcheck on a custom
autograd.Function in float64 and names the worst Jacobian entry. Each finding names the skill
to read for the fix.""",
    ),
    TorchTool(
        name="verify_checkpoint",
        request=VerifyCheckpointRequest,
        result=VerifyCheckpointResult,
        worker="torch_skills.checkpoint.worker:run",
        path_arguments=("path", "model", "inputs"),
        hidden=("loss", "max_listed"),
        description="""Is this checkpoint safe to load, complete for resuming, and does it fit my model?

Never executes the file: every pickle reachable from the path (zip and tar members, .pt2, .npy/
.npz, joblib, legacy torch, DCP, every file of a folder) is read statically, as its own loader
reads it, and each global it would import is checked. `verdict`: safe; safe_with_allowlist (only
data classes such as Namespace or OmegaConf; `allowlist_recipe` gives the safe_globals code);
unsafe (os.system, exec, gadget chains, bombs...) with file and byte offset; or corrupt; one per
file of a folder. Safe files are opened (weights_only=True, mmap): tensors, dtypes, NaN/Inf,
resume pieces present, optimizer consistency. With `model`: keys and shapes compared as
load_state_dict/from_pretrained treat them, the exact call per loader, the prefix fix, optionally
a run; a PEFT adapter folder against `model` as its base, as PEFT loads it.""",
    ),
    TorchTool(
        name="estimate_memory",
        request=EstimateMemoryRequest,
        result=EstimateMemoryResult,
        worker="torch_skills.memory.worker:run",
        timeout_s=600.0,
        description="""Estimate peak GPU (or CPU) memory of one training or inference step, without a GPU and without
allocating the model: the factory and one step run on fake tensors, so a 7B model is estimated on a
laptop. Returns peak allocated and reserved bytes, a breakdown (parameters, gradients, optimizer
state, activations, temporaries) at the peak, the phase and module where it happens, the modules
saving the most activations, per-rank figures under DDP/ZeRO/FSDP, whether it fits
device_memory_gib and the largest batch size that does, with findings naming the skill to read.
Use it before an OOM ("will it fit?") or after one ("what takes the memory?").""",
    ),
    TorchTool(
        name="profile_model",
        request=ProfileRequest,
        result=ProfileResult,
        worker="torch_skills.profiling.worker:run",
        timeout_s=300.0,
        path_arguments=("model", "inputs", "loss", "data", "trace_path"),
        annotations=RUNS_USER_CODE_WRITES_TRACE,
        description="""Measure a real training or inference step of the user's model and say what bounds it.

Times the step without the profiler (median, IQR), then profiles it: top operators, time per
phase and top-level module, FLOPs and MFU, bytes moved, peak memory, loader wait, host syncs
(.item() etc., with module and line). Returns the bottleneck (data_loading,
cpu_overhead, compute, memory_bandwidth or unknown) with its evidence, and findings naming
the skill that fixes it. Use it before optimizing a slow training loop.""",
    ),
    TorchTool(
        name="check_distributed",
        request=DistributedRequest,
        result=DistributedResult,
        worker="torch_skills.distributed.worker:run",
        path_arguments=("model", "inputs", "loss", "data"),
        hidden=("seed",),
        description="""Run the user's training step on world_size real ranks (gloo on CPU, nccl on GPUs) under DDP or
FSDP2 and say what breaks at scale, before renting the GPUs. Findings (kind, names or rank,
file:line, fix): unused_parameters (always vs data-dependent), collective_mismatch (first
divergent call per rank; a hang is reported, never waited out), replica_divergence,
gradient_scale (vs one process on the global batch: summed loss), data_sharding (no
DistributedSampler, set_epoch, unequal batch counts), rank_failure. Also collectives per step
and rank, DDP buckets, peak memory per rank.""",
    ),
)

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
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.server.mcpserver.prompts.base import Prompt
from mcp.server.mcpserver.resources import FunctionResource
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, RequestParams, ToolAnnotations
from pydantic import BaseModel, Field

from torch_skills import __version__
from torch_skills.checkpoint.models import VerifyCheckpointRequest, VerifyCheckpointResult
from torch_skills.gradients.models import GradientRequest, GradientResult
from torch_skills.memory.models import EstimateMemoryRequest, EstimateMemoryResult
from torch_skills.profiling.models import ProfileRequest, ProfileResult
from torch_skills.roots import AllowedRoots
from torch_skills.runner.pool import WorkerPool, default_memory_limit_bytes
from torch_skills.skillpack.loader import (
    DEFAULT_SKILLS_DIR,
    ROUTER_NAME,
    SkillPack,
    SkillPathError,
    UnknownSkill,
    mime_type_for,
)
from torch_skills.skillpack.route import Router, RouteResult
from torch_skills.skillpack.router import RouterFormatError, parse_router
from torch_skills.torch_tools import (
    RUNS_USER_CODE_WRITES_TRACE,
    TorchTool,
    anticipated_errors,
    register_torch_tool,
)
from torch_skills.wire import install_wire_safety

log = logging.getLogger("torch-skills")

SKILLS_EXTENSION = "io.modelcontextprotocol/skills"
LISTING_TTL_MS = 300_000

INSTRUCTIONS = f"""\
PyTorch engineering help. Start with the router skill skill://{ROUTER_NAME}/SKILL.md: it maps a
symptom (out of memory, NaN loss, slow steps, DDP hangs, checkpoint errors...) to one of eight
specialist skills. When unsure where a question belongs, call `route` with the user's words or
the pasted error. Diagnose before fixing: the tools run on the user's own code in a sandboxed
worker - `check_gradients` (NaN/Inf source, dead or exploding gradients, gradcheck),
`estimate_memory` (peak memory before running on a GPU), `profile_model` (what bounds a step),
`verify_checkpoint` (is a checkpoint safe, complete, does it fit the model). Models are given as
'path/to/file.py:factory'. Clients without the Skills extension can use `list_skills` and
`get_skill`."""

# Seconds after start-up before the torch worker is started: the handshake and tools/list come
# first (bench/startup.py), and an agent's first tool call comes later than that.
PREWARM_DELAY_S = 1.0

# Modules the warm worker imports before forking, so every call starts with them loaded.
WORKER_PRELOAD = (
    "torch_skills.runner.usercode",
    "torch_skills.gradients.worker",
    "torch_skills.checkpoint.worker",
    "torch_skills.memory.worker",
    "torch_skills.profiling.worker",
)


# ------------------------------------------------------------------------------------------------
# Skills extension (io.modelcontextprotocol/skills): skills/list and skills/get
# ------------------------------------------------------------------------------------------------
class ListSkillsParams(RequestParams):
    cursor: str | None = None


class GetSkillParams(RequestParams):
    uri: str


class SkillsExtension(Extension):
    """Serves `skills/list` and `skills/get` from the same SkillPack as the resources."""

    identifier = SKILLS_EXTENSION

    def __init__(self, pack: SkillPack):
        self.pack = pack

    def methods(self) -> Sequence[MethodBinding]:
        return (
            MethodBinding("skills/list", ListSkillsParams, self._list),
            MethodBinding("skills/get", GetSkillParams, self._get),
        )

    async def _list(self, ctx: Any, params: ListSkillsParams) -> dict[str, Any]:
        skills = [self.pack.entry(name) for name in self.pack.skills]
        return {"resultType": "complete", "skills": skills, "ttlMs": LISTING_TTL_MS, "cacheScope": "public"}

    async def _get(self, ctx: Any, params: GetSkillParams) -> dict[str, Any]:
        try:
            name, path = self.pack.parse_uri(params.uri)
            if path != "SKILL.md":
                raise SkillPathError(f"{params.uri!r} is not the URI of a SKILL.md")
            entry = self.pack.entry(name)
        except (SkillPathError, UnknownSkill) as e:
            raise MCPError(INVALID_PARAMS, str(e)) from None
        return {"resultType": "complete", "skill": entry, "ttlMs": LISTING_TTL_MS, "cacheScope": "public"}


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
    text: str


# ------------------------------------------------------------------------------------------------
# Server state shared by the tool calls
# ------------------------------------------------------------------------------------------------
@dataclass
class ServerState:
    pack: SkillPack
    roots: AllowedRoots
    pool: WorkerPool
    memory_limit_bytes: int


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
) -> MCPServer:
    """The configured MCPServer. Tests use `Client(build_server())`; `main()` runs it."""
    pack = SkillPack.load(skills_dir)
    roots = AllowedRoots(Path.cwd(), tuple(Path(p) for p in allow))
    memory_limit = int(memory_limit_gib * 2**30) if memory_limit_gib else default_memory_limit_bytes()

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[ServerState]:
        async with WorkerPool(max_concurrent=max_jobs, preload=WORKER_PRELOAD) as pool:
            if prewarm:
                pool.prewarm(delay_s=PREWARM_DELAY_S)
            yield ServerState(pack, roots, pool, memory_limit)

    mcp = MCPServer(
        "torch-skills",
        title="PyTorch engineering skills",
        instructions=INSTRUCTIONS,
        version=__version__,
        extensions=[SkillsExtension(pack)],
        lifespan=lifespan,
    )
    install_wire_safety(mcp)  # every string leaving the server is valid UTF-8
    _register_skill_resources(mcp, pack)
    _register_skill_tools(mcp, pack)
    _register_route(mcp, pack)
    _register_prompts(mcp, pack)
    for tool in TORCH_TOOLS:
        register_torch_tool(mcp, tool)
    return mcp


def _register_skill_resources(mcp: MCPServer, pack: SkillPack) -> None:
    for skill in pack.skills.values():
        for file in skill.files:

            def read(name: str = skill.name, path: str = file.path) -> str | bytes:
                try:
                    data = pack.read(name, path)
                except (SkillPathError, UnknownSkill) as e:  # the file went away since start-up
                    raise ResourceNotFoundError(str(e)) from None
                try:
                    return data.decode("utf-8")
                except UnicodeDecodeError:
                    return data

            mcp.add_resource(
                FunctionResource(
                    uri=skill.uri(file.path),
                    name=skill.name if file.path == "SKILL.md" else f"{skill.name}/{file.path}",
                    description=skill.description if file.path == "SKILL.md" else None,
                    mime_type=mime_type_for(file.path),
                    fn=read,
                    meta={"io.modelcontextprotocol.skills/digest": file.digest},
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
    ) -> SkillText:
        """Read one file of a skill (its SKILL.md by default, or a file under references/)."""
        with anticipated_errors():
            data = pack.read(name, path)
        return SkillText(
            name=name, path=path, uri=pack.get(name).uri(path), text=data.decode("utf-8", "replace")
        )


def _register_route(mcp: MCPServer, pack: SkillPack) -> None:
    router = Router.from_pack(pack)

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False))
    def route(
        query: Annotated[
            str, Field(description="the user's symptom, question or pasted error message, verbatim")
        ],
    ) -> RouteResult:
        """Say which PyTorch skill to read for a symptom or error, or the one question to ask first.

        Returns skills in reading order (the first is where to start), the diagnostic tools to run,
        the router phrases that matched, and a confidence. For a query too vague to route
        ("fix my training") it returns `clarify`: ask the user that question, then route again."""
        return router.route(query)


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


def _prompt_renderer(name: str, tools: list[str]):
    def render(
        problem: Annotated[
            str, Field(description="the symptom, error message or question, in your own words")
        ],
    ) -> str:
        return _prompt_template().render(name=name, tools=tools, problem=problem)

    return render


def _register_prompts(mcp: MCPServer, pack: SkillPack) -> None:
    tools_by_skill = skill_tools(pack)
    for skill in pack.skills.values():
        if skill.name == ROUTER_NAME:
            continue
        mcp.add_prompt(
            Prompt.from_function(
                _prompt_renderer(skill.name, tools_by_skill.get(skill.name, [])),
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

Never executes the file: every pickle in it (torch zip data.pkl and any hidden member, legacy
torch files, plain pickles, DCP .metadata and bytes items) is disassembled statically and
every global it would import is checked against what torch.load(weights_only=True) allows;
anything else (os.system, exec, importlib, gadget chains, names computed at load time,
broken or truncated pickles) makes `safe` false, with file and byte offset. Corrupt or
hostile structure (truncated zips, '..' member names, sizes beyond the file, lying
safetensors headers, deep nesting) is reported too. Only a safe file is opened
(torch.load(weights_only=True, mmap=True), or safetensors read by offset): tensor count,
bytes and dtypes, NaN/Inf counts, which resume pieces are present (model, optimizer,
scheduler, grad scaler, epoch/step, torch/cuda/numpy/python RNG, sampler) and optimizer
consistency. With `model`, compares keys and shapes, detects the prefix fix (module.,
_orig_mod., _fsdp_wrapped_module., ...) and can load strictly and run a forward.""",
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
(.item() and the like, named with module and line). Returns the bottleneck (data_loading,
cpu_overhead, compute, memory_bandwidth or unknown) with its evidence, and findings naming
the skill that fixes it. Use it before optimizing a slow training loop.""",
    ),
)

"""torch-skills: a PyTorch engineering skill pack and diagnostic tools, served over MCP.

Run it:
    python server.py                              # stdio, for Claude Code / Desktop / Cursor
    python server.py --transport http --port 8765 # streamable HTTP on 127.0.0.1
    python server.py --check                      # validate the skills and exit
    python server.py --demo                       # call every tool on examples/ and print results

This file is the MCP wiring only. Skills come from `skills/` (one source for the Skills
extension, the skill:// resources, the list_skills/get_skill tools, the prompts and `route`);
tool logic lives in `tools/` and runs in worker processes (`tools.runner`), never here. torch is
never imported by this process.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import Context, ListRoots, MCPServer, Resolve
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.server.mcpserver.prompts.base import Prompt
from mcp.server.mcpserver.resources import FunctionResource
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, ListRootsResult, RequestParams, ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from tools.checkpoint.models import VerifyCheckpointRequest, VerifyCheckpointResult
from tools.gradients.models import GradientRequest, GradientResult
from tools.memory.models import (
    EstimateMemoryRequest,
    EstimateMemoryResult,
    OptimizerName,
    Sharding,
    TargetDevice,
)
from tools.profiling.models import BatchInput, Optimizer, ProfileRequest, ProfileResult
from tools.roots import AllowedRoots, PathNotAllowed
from tools.runner.errors import WorkerError
from tools.runner.pool import WorkerPool, default_memory_limit_bytes
from tools.skillpack.loader import (
    DEFAULT_SKILLS_DIR,
    ROUTER_NAME,
    SkillPack,
    SkillPathError,
    UnknownSkill,
    mime_type_for,
)
from tools.skillpack.route import Router, RouteResult
from tools.skillpack.router import RouterFormatError, parse_router
from tools.userspec import CodeRef, CodeRefError, Device, DType, Mode, Precision

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
    "tools.runner.usercode",
    "tools.gradients.worker",
    "tools.checkpoint.worker",
    "tools.memory.worker",
    "tools.profiling.worker",
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


def _path_in(value: str) -> str | None:
    """The file a tool argument points at: 'models.py:build' -> 'models.py'; a plain path as is."""
    try:
        ref = CodeRef.parse(value)
    except CodeRefError:
        return value
    return ref.path


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
            path = _path_in(value) if value else None
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
) -> dict[str, Any]:
    """Run a tool function in a fresh worker child; return its result dict with `run` facts filled in.

    Every path the request names must be in `check_paths`: they are checked here, before any code
    runs, against the server's roots plus `client_roots` (from `client_roots_when_needed`).
    Raises ToolError with the next step on failure.
    """
    state: ServerState = ctx.request_context.lifespan_context
    roots = state.roots
    if client_roots is not None and client_roots.roots:
        roots = roots.with_client_roots([str(r.uri) for r in client_roots.roots])
    with anticipated_errors():
        for path in check_paths:
            roots.check(path)

    async def progress(done: float, total: float | None, message: str | None) -> None:
        await ctx.report_progress(done, total, message)

    limit = int(memory_limit_gib * 2**30) if memory_limit_gib else state.memory_limit_bytes
    with anticipated_errors():
        job = await state.pool.run(
            fn,
            request,
            timeout_s=timeout_s,
            memory_limit_bytes=limit,
            device=device,
            cwd=roots.cwd,
            allowed_roots=list(roots.all),
            on_progress=progress,
        )
    result = dict(job.result)
    result["run"] = {
        "device": job.device,
        "torch_version": job.torch_version,
        "wall_time_s": job.wall_time_s,
        "output": job.output,
        "output_bytes": job.output_bytes,
        "output_truncated": job.output_truncated,
    }
    return result


# Arguments every torch tool shares (the user-code contract, tools.userspec.ModelInputs).
ModelArg = Annotated[
    str,
    Field(
        description="model factory, 'path/to/file.py:build' or 'package.module:build'; returns an nn.Module"
    ),
]
ModelKwargsArg = Annotated[dict[str, Any] | None, Field(description="keyword arguments for the factory")]
InputsArg = Annotated[
    str | None,
    Field(
        description="'file.py:make_inputs' returning one batch (tensor, tuple or dict); or give input_shape"
    ),
]
InputShapeArg = Annotated[
    list[int] | None, Field(description="shape of a random input batch, e.g. [8, 3, 32, 32]")
]
InputDtypeArg = Annotated[DType, Field(description="dtype of the random input batch")]
LossArg = Annotated[
    str | None,
    Field(description="'file.py:loss_fn' called as loss_fn(output, batch); default: mean of the output"),
]
DeviceArg = Annotated[Device, Field(description="'auto' uses CUDA when present")]
RUNS_USER_CODE = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
# profile_model may write a trace file (trace_path), so it is not read-only; it never overwrites user data
RUNS_USER_CODE_WRITES_TRACE = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, open_world_hint=False
)

# The client's MCP roots, fetched only when an argument points outside the server's roots.
GradientRoots = client_roots_when_needed("model", "function", "inputs", "loss")
CheckpointRoots = client_roots_when_needed("path", "model", "inputs")
MemoryRoots = client_roots_when_needed("model", "inputs", "loss")
ProfileRoots = client_roots_when_needed("model", "inputs", "loss", "data", "trace_path")

TimeoutArg = Annotated[float, Field(gt=0, le=3600, description="seconds before the run is stopped")]
MemoryArg = Annotated[
    float | None,
    Field(default=None, gt=0, description="RAM cap in GiB for the run (default: half the machine)"),
]
# verify_checkpoint: the model is optional there
OptionalModelArg = Annotated[
    str | None,
    Field(
        description="optional model factory 'path/to/file.py:build' (returns an nn.Module): compares the "
        "checkpoint's keys, shapes and optimizer state with this model"
    ),
]


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
        version="0.1.0",
        extensions=[SkillsExtension(pack)],
        lifespan=lifespan,
    )
    _register_skill_resources(mcp, pack)
    _register_skill_tools(mcp, pack)
    _register_route(mcp, pack)
    _register_prompts(mcp, pack)
    _register_torch_tools(mcp)
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


def _register_torch_tools(mcp: MCPServer) -> None:
    """The tools that run the user's code.

    Each one follows the same three steps: build its request model (a `ModelInputs` subclass from
    `tools/<tool>/models.py`) inside `anticipated_errors()`, `run_in_worker(ctx,
    "tools.<tool>.worker:run", request, ..., check_paths=request.named_paths())`, and
    validate the returned dict into its result model (which has a `run: RunInfo | None` field).
    """

    # -- check_gradients --
    @mcp.tool(annotations=RUNS_USER_CODE)
    async def check_gradients(
        ctx: Context,
        model: Annotated[
            str | None,
            Field(
                description="model factory, 'path/to/file.py:build' or 'package.module:build'; give this or function"
            ),
        ] = None,
        function: Annotated[
            str | None,
            Field(
                description="gradcheck mode instead of a model: 'file.py:MyFunction', an autograd.Function subclass "
                "or a plain callable; inputs/input_shape are its arguments (keep them small, e.g. [3, 4])"
            ),
        ] = None,
        model_kwargs: ModelKwargsArg = None,
        inputs: InputsArg = None,
        input_shape: InputShapeArg = None,
        input_dtype: InputDtypeArg = "float32",
        loss: LossArg = None,
        device: DeviceArg = "auto",
        gradgradcheck: Annotated[
            bool, Field(description="gradcheck mode: also check second derivatives")
        ] = False,
        fast_mode: Annotated[
            bool, Field(description="gradcheck mode: torch's faster randomized gradcheck")
        ] = False,
        train_mode: Annotated[
            bool, Field(description="run the model in train() mode (False: eval())")
        ] = True,
        timeout_s: TimeoutArg = 120.0,
        memory_limit_gib: MemoryArg = None,
        client_roots: GradientRoots = None,
    ) -> GradientResult:
        """Run one forward + backward on the user's model and say what is wrong with its gradients.

        Finds where the first NaN/Inf is created (module, op, source line; forward, loss or backward,
        with the autograd node), parameters that get no gradient and why (branch never run, detach,
        no_grad), exploding/vanishing gradients by layer depth, dead ReLUs, and per-parameter grad and
        weight norms. With `function` instead of `model` it runs torch.autograd.gradcheck on a custom
        autograd.Function in float64 and names the worst Jacobian entry. Each finding names the skill
        to read for the fix."""
        with anticipated_errors():
            request = GradientRequest(
                model=model,
                function=function,
                model_kwargs=model_kwargs or {},
                inputs=inputs,
                input_shape=input_shape,
                input_dtype=input_dtype,
                loss=loss,
                device=device,
                gradgradcheck=gradgradcheck,
                fast_mode=fast_mode,
                train_mode=train_mode,
            )
        result = await run_in_worker(
            ctx,
            "tools.gradients.worker:run",
            request,
            timeout_s=timeout_s,
            memory_limit_gib=memory_limit_gib,
            device=device,
            check_paths=request.named_paths(),
            client_roots=client_roots,
        )
        return GradientResult.model_validate(result)

    # -- verify_checkpoint --
    @mcp.tool(annotations=RUNS_USER_CODE)
    async def verify_checkpoint(
        path: Annotated[
            str,
            Field(
                description="checkpoint file (.pt .pth .ckpt .bin .pkl .safetensors, *.index.json) or folder "
                "(DCP with .metadata, Hugging Face model or Trainer checkpoint)"
            ),
        ],
        ctx: Context,
        model: OptionalModelArg = None,
        model_kwargs: ModelKwargsArg = None,
        load_and_run: Annotated[
            bool,
            Field(
                description="load the weights into the model with strict=True (after the detected key rename) "
                "and run one forward; needs model and inputs or input_shape"
            ),
        ] = False,
        inputs: InputsArg = None,
        input_shape: InputShapeArg = None,
        input_dtype: InputDtypeArg = "float32",
        scan_nonfinite: Annotated[bool, Field(description="count NaN/Inf in every floating tensor")] = True,
        allow_numpy: Annotated[
            bool, Field(description="treat numpy array/scalar/dtype globals as safe data")
        ] = True,
        device: DeviceArg = "auto",
        timeout_s: TimeoutArg = 120,
        memory_limit_gib: MemoryArg = None,
        client_roots: CheckpointRoots = None,
    ) -> VerifyCheckpointResult:
        """Is this checkpoint safe to load, complete for resuming, and does it fit my model?

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
        _orig_mod., _fsdp_wrapped_module., ...) and can load strictly and run a forward."""
        with anticipated_errors():
            request = VerifyCheckpointRequest(
                path=path,
                model=model,
                model_kwargs=model_kwargs or {},
                load_and_run=load_and_run,
                inputs=inputs,
                input_shape=input_shape,
                input_dtype=input_dtype,
                scan_nonfinite=scan_nonfinite,
                allow_numpy=allow_numpy,
                device=device,
            )
        result = await run_in_worker(
            ctx,
            "tools.checkpoint.worker:run",
            request,
            timeout_s=timeout_s,
            memory_limit_gib=memory_limit_gib,
            device=device,
            check_paths=request.named_paths(),
            client_roots=client_roots,
        )
        with anticipated_errors():
            return VerifyCheckpointResult.model_validate(result)

    # -- estimate_memory --------------------------------------------------------------------------
    @mcp.tool(annotations=RUNS_USER_CODE)
    async def estimate_memory(
        ctx: Context,
        model: ModelArg,
        model_kwargs: ModelKwargsArg = None,
        inputs: InputsArg = None,
        input_shape: InputShapeArg = None,
        input_dtype: InputDtypeArg = "float32",
        loss: LossArg = None,
        mode: Annotated[
            Mode, Field(description="train: forward + backward + optimizer step; inference: forward only")
        ] = "train",
        optimizer: Annotated[
            OptimizerName, Field(description="optimizer whose state is counted (train)")
        ] = "adamw",
        precision: Annotated[
            Precision,
            Field(
                description="fp32, bf16/fp16 (model cast), bf16_autocast/fp16_autocast (fp32 weights, autocast forward)"
            ),
        ] = "fp32",
        activation_checkpointing: Annotated[
            list[str] | None,
            Field(description="module class names to recompute in backward, e.g. ['Block']; omit for off"),
        ] = None,
        batch_size: Annotated[
            int | None, Field(ge=1, description="batch size to estimate (default: the batch given)")
        ] = None,
        gradient_accumulation: Annotated[
            int, Field(ge=1, description="micro-batches per optimizer step")
        ] = 1,
        world_size: Annotated[int, Field(ge=1, description="data-parallel ranks; figures are per rank")] = 1,
        sharding: Annotated[Sharding, Field(description="none, ddp, zero1, zero2 or fsdp")] = "none",
        device_memory_gib: Annotated[
            float | None,
            Field(
                gt=0,
                description="memory of one device in GiB: answers 'does it fit' and finds the max batch size",
            ),
        ] = None,
        target_device: Annotated[
            TargetDevice,
            Field(
                description="cuda (default): CUDA allocator rounding, cache and context; cpu: exact tensor bytes"
            ),
        ] = "cuda",
        device: DeviceArg = "auto",
        timeout_s: TimeoutArg = 600,
        memory_limit_gib: MemoryArg = None,
        client_roots: MemoryRoots = None,
    ) -> EstimateMemoryResult:
        """Estimate peak GPU (or CPU) memory of one training or inference step, without a GPU and without
        allocating the model: the factory and one step run on fake tensors, so a 7B model is estimated on a
        laptop. Returns peak allocated and reserved bytes, a breakdown (parameters, gradients, optimizer
        state, activations, temporaries) at the peak, the phase and module where it happens, the modules
        saving the most activations, per-rank figures under DDP/ZeRO/FSDP, whether it fits
        device_memory_gib and the largest batch size that does, with findings naming the skill to read.
        Use it before an OOM ("will it fit?") or after one ("what takes the memory?")."""
        with anticipated_errors():
            request = EstimateMemoryRequest(
                model=model,
                model_kwargs=model_kwargs or {},
                inputs=inputs,
                input_shape=input_shape,
                input_dtype=input_dtype,
                loss=loss,
                device=device,
                mode=mode,
                optimizer=optimizer,
                precision=precision,
                activation_checkpointing=activation_checkpointing or "off",
                batch_size=batch_size,
                gradient_accumulation=gradient_accumulation,
                world_size=world_size,
                sharding=sharding,
                device_memory_gib=device_memory_gib,
                target_device=target_device,
            )
        result = await run_in_worker(
            ctx,
            "tools.memory.worker:run",
            request,
            timeout_s=timeout_s,
            memory_limit_gib=memory_limit_gib,
            device=device,
            check_paths=request.named_paths(),
            client_roots=client_roots,
        )
        return EstimateMemoryResult.model_validate(result)

    # -- profile_model --
    @mcp.tool(annotations=RUNS_USER_CODE_WRITES_TRACE)
    async def profile_model(
        model: ModelArg,
        ctx: Context,
        model_kwargs: ModelKwargsArg = None,
        inputs: InputsArg = None,
        input_shape: InputShapeArg = None,
        input_dtype: InputDtypeArg = "float32",
        loss: LossArg = None,
        data: Annotated[
            str | None,
            Field(
                description="'file.py:make_loader' returning an iterable of batches (e.g. a DataLoader), "
                "instead of inputs/input_shape; the time spent in next(loader) is measured"
            ),
        ] = None,
        batch_input: Annotated[
            BatchInput,
            Field(description="'first' feeds only batch[0] to the model, for (inputs, targets) pairs"),
        ] = "whole",
        mode: Annotated[
            Mode, Field(description="'train': forward, loss, backward, optimizer step; 'inference': forward")
        ] = "train",
        optimizer: Annotated[Optimizer, Field(description="optimizer for train mode")] = "adamw",
        precision: Annotated[
            Precision,
            Field(description="fp32, bf16/fp16 (model cast), bf16_autocast/fp16_autocast (torch.autocast)"),
        ] = "fp32",
        warmup_steps: Annotated[int, Field(ge=1, le=100, description="steps before timing starts")] = 3,
        active_steps: Annotated[int, Field(ge=3, le=200, description="steps timed, then profiled")] = 10,
        compile: Annotated[
            bool, Field(description="also time torch.compile(model): compile time and speed-up over eager")
        ] = False,
        trace_path: Annotated[
            str | None,
            Field(description="write a Chrome/Perfetto trace (.json) of the profiled steps here"),
        ] = None,
        top_k: Annotated[int, Field(ge=1, le=100, description="operators listed in top_ops")] = 15,
        cpu_threads: Annotated[
            int | None,
            Field(
                ge=1,
                le=1024,
                description="torch.set_num_threads for the run; 1 steadies timings on a busy machine",
            ),
        ] = None,
        device: DeviceArg = "auto",
        timeout_s: TimeoutArg = 300,
        memory_limit_gib: MemoryArg = None,
        client_roots: ProfileRoots = None,
    ) -> ProfileResult:
        """Measure a real training or inference step of the user's model and say what bounds it.

        Times the step without the profiler (median, IQR), then profiles it: top operators, time per
        phase and top-level module, FLOPs and MFU, bytes moved, peak memory, loader wait, host syncs
        (.item() and the like, named with module and line). Returns the bottleneck (data_loading,
        cpu_overhead, compute, memory_bandwidth or unknown) with its evidence, and findings naming
        the skill that fixes it. Use it before optimizing a slow training loop.
        """
        with anticipated_errors():
            request = ProfileRequest(
                model=model,
                model_kwargs=model_kwargs or {},
                inputs=inputs,
                input_shape=input_shape,
                input_dtype=input_dtype,
                loss=loss,
                device=device,
                data=data,
                batch_input=batch_input,
                mode=mode,
                optimizer=optimizer,
                precision=precision,
                warmup_steps=warmup_steps,
                active_steps=active_steps,
                compile=compile,
                trace_path=trace_path,
                top_k=top_k,
                cpu_threads=cpu_threads,
            )
        result = await run_in_worker(
            ctx,
            "tools.profiling.worker:run",
            request,
            timeout_s=timeout_s,
            memory_limit_gib=memory_limit_gib,
            device=device,
            check_paths=request.named_paths(),
            client_roots=client_roots,
        )
        return ProfileResult.model_validate(result)


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="torch-skills MCP server")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument(
        "--allow", action="append", default=[], metavar="DIR", help="another folder the tools may read"
    )
    p.add_argument("--skills-dir", type=Path, default=DEFAULT_SKILLS_DIR)
    p.add_argument(
        "--max-jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)), help="concurrent tool runs"
    )
    p.add_argument("--memory-limit-gib", type=float, default=None, help="default RAM cap per tool run")
    p.add_argument(
        "--no-prewarm", action="store_true", help="start the torch worker on the first call instead"
    )
    p.add_argument("--check", action="store_true", help="validate the skills and exit (non-zero on problems)")
    p.add_argument("--demo", action="store_true", help="run every tool on examples/ and print what it finds")
    p.add_argument("--log-level", default="WARNING")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr)
    if args.check:
        from tools.skillpack.validate import validate_pack

        report = validate_pack(args.skills_dir)
        sys.stderr.write(report.render() + "\n")
        return 0 if report.ok else 1
    if args.demo:
        from examples.demo import run_demo

        return run_demo()
    server = build_server(
        args.skills_dir,
        allow=[Path(a) for a in args.allow],
        max_jobs=args.max_jobs,
        prewarm=not args.no_prewarm,
        memory_limit_gib=args.memory_limit_gib,
    )
    if args.transport == "http":
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

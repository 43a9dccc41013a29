"""estimate_memory's tool function, run in a forked worker child: `run(request, job) -> result`.

Use through the MCP server (tool `estimate_memory`), or directly in tests:

    result = run(EstimateMemoryRequest(model="net.py:build", input_shape=[8, 512]), job)

Steps: trace one step on fake tensors (`torch_skills.memory.trace`); if that fails (data-dependent
control flow, `.item()`), measure real runs at batch sizes 2 and 3 and extrapolate linearly;
replay the trace for the target device and parallel layout (`torch_skills.memory.estimate`); search the
largest batch that fits when `device_memory_gib` is given (`torch_skills.memory.search`); explain
(`torch_skills.memory.findings`).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import resource
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch

from torch_skills.memory.blocks import NO_FORWARD, checkpoint_candidates
from torch_skills.memory.construct import describe_trace_failure, fake_safe_construction
from torch_skills.memory.cudakernels import CudaKernelModel, GpuSpec
from torch_skills.memory.estimate import Estimate, Target, estimate_trace, extrapolate
from torch_skills.memory.findings import DOMINANT_SHARE, Facts, memory_findings, memory_summary
from torch_skills.memory.models import (
    ActivationSaver,
    CheckpointOption,
    EstimateMemoryRequest,
    EstimateMemoryResult,
    MemoryBreakdown,
    TracedBatch,
)
from torch_skills.memory.overheads import local_gpu_is_hopper
from torch_skills.memory.search import BatchSearch, max_batch_size
from torch_skills.memory.trace import (
    CheckpointTargetMissing,
    StepSpec,
    Trace,
    fake_mode,
    trace_step,
)
from torch_skills.results import BatchRule
from torch_skills.runner.errors import UserCodeError
from torch_skills.runner.usercode import (
    build_model,
    compute_loss,
    describe_rule,
    load_callable,
    make_batch,
    resolve_device,
    user_code,
)

TOP_SAVERS = 10
# Real runs the fallback extrapolates from: not batch 1, where CPU convolutions take another algorithm
# (a 1-D conv's oneDNN scratch is 13x smaller at batch 1 than the line through batches 2 and 3 gives).
FALLBACK_BATCHES = (2, 3)


def run(request: EstimateMemoryRequest, job) -> EstimateMemoryResult:
    device = resolve_device(request.device)
    target_cuda = request.target_device == "cuda"
    spec = StepSpec(
        mode=request.mode,
        optimizer=request.optimizer,
        precision=request.precision,
        checkpoint_classes=request.checkpoint_classes,
        micro_batches=request.gradient_accumulation,
        foreach=target_cuda,  # CUDA's default optimizer implementation is foreach; the CPU's is the for-loop
    )
    capacity = int(request.device_memory_gib * 2**30) if request.device_memory_gib else None
    hopper = local_gpu_is_hopper()
    target = Target(
        cuda=target_cuda,
        capacity_bytes=capacity,
        sharding=request.sharding,
        world_size=request.world_size,
        hopper=bool(hopper),
        training=request.mode == "train",
    )
    tracer = _Tracer(request, job, spec, device, probe_scratch=(device.type == "cuda") == target_cuda)
    batch = request.batch_size or (
        request.input_shape[0] if request.inputs is None and request.input_shape else None
    )
    variable_batch = tracer.batch_is_variable()

    job.progress(0, 4, "tracing one step on fake tensors")
    failure = None
    try:
        trace = tracer.trace(batch)
        method, detail = "traced", _traced_detail(trace, device)
    except UserCodeError as exc:
        if exc.kind == "bad_request":
            raise
        failure, trace = describe_trace_failure(exc, _failed_phase(exc)), None
    if trace is not None:
        est = estimate_trace(trace, target)
        runner = lambda b: estimate_trace(tracer.trace(b), target)  # noqa: E731 - one more trace per batch size
    else:
        job.progress(1, 4, "tracing failed; measuring real runs at small batch sizes")
        trace, est, method, detail, runner = _fallback(tracer, target, batch, variable_batch, failure)

    single = None
    if request.world_size > 1 and request.sharding != "none":
        single = (
            estimate_trace(trace, replace(target, sharding="none", world_size=1))
            if method == "traced"
            else None
        )

    grad_accum_extra = 0
    if request.mode == "train" and request.gradient_accumulation > 1 and method == "traced":
        one = estimate_trace(
            _Tracer(request, job, replace(spec, micro_batches=1), device, tracer.probe_scratch).trace(
                est.batch_size
            ),
            target,
        )
        grad_accum_extra = est.peak_allocated - one.peak_allocated

    search = BatchSearch(None, "give device_memory_gib to search for the largest batch size")
    if capacity is not None:
        if not variable_batch:
            search = BatchSearch(
                None, "the inputs function takes no batch_size argument, so the batch cannot be varied"
            )
        else:
            job.progress(2, 4, "searching the largest batch size that fits")
            search = max_batch_size(runner, est, capacity_bytes=capacity)

    options = []
    if _activations_dominate(request, est) and method in ("traced", "measured"):
        job.progress(3, 4, "estimating activation checkpointing on the repeated blocks")
        options = _checkpoint_options(tracer, trace, est, target, batch, fake=method == "traced")

    job.progress(3, 4, "writing the result")
    result = _result(
        request,
        trace,
        est,
        single,
        method,
        detail,
        failure,
        device,
        capacity,
        search,
        grad_accum_extra,
        options,
    )
    result.batch_rule = tracer.rule
    return result


# -- tracing the user's code ------------------------------------------------------------------
class _Tracer:
    """Calls trace_step on the user's factory, inputs and loss, turning failures into UserCodeError."""

    def __init__(
        self, request: EstimateMemoryRequest, job, spec: StepSpec, device: torch.device, probe_scratch: bool
    ):
        self.request, self.job, self.spec, self.device = request, job, spec, device
        self.probe_scratch = probe_scratch
        # CUDA kernels' own scratch (reductions), sized for the local GPU or an H100
        self.kernels = (
            CudaKernelModel(GpuSpec.local_or_default()) if request.target_device == "cuda" else None
        )
        self.model: torch.nn.Module | None = None  # the last model built (the batch rule reads its forward)
        self.rule: BatchRule | None = None  # how the last batch was fed and the loss taken

    def build(self) -> torch.nn.Module:
        self.model = build_model(self.request, self.job.cwd, self.job.allowed_roots, to_device=False)
        return self.model

    def batch(self, batch_size: int | None):
        batch = make_batch(self.request, self.job.cwd, self.job.allowed_roots, None, batch_size=batch_size)
        self.rule = describe_rule(self.model, batch, None)
        return batch

    def loss(self, output, batch) -> torch.Tensor:
        loss, how = compute_loss(
            self.request, self.job.cwd, self.job.allowed_roots, output, batch, self.model
        )
        self.rule = describe_rule(self.model, batch, how)
        return loss

    def batch_is_variable(self) -> bool:
        if self.request.inputs is None:
            return True
        fn = load_callable(self.request.inputs, self.job.cwd, self.job.allowed_roots, "the inputs function")
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return False
        return "batch_size" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    def trace(
        self, batch_size: int | None, *, fake: bool = True, device: torch.device | None = None
    ) -> Trace:
        with user_code("the traced step (forward, loss, backward, optimizer step)"), _quiet_fake_tensor_log():
            try:
                return trace_step(
                    self.build,
                    self.batch,
                    self.loss,
                    self.spec,
                    device=device or self.device,
                    batch_size=batch_size,
                    fake=fake,
                    probe_scratch=self.probe_scratch,
                    cuda_kernels=self.kernels,
                )
            except CheckpointTargetMissing as exc:  # the request is wrong, not the code: no fallback
                raise UserCodeError("bad_request", str(exc)) from exc


@contextlib.contextmanager
def _quiet_fake_tensor_log() -> Iterator[None]:
    """Keep torch's fake-tensor logger from printing a traceback for every op that fails under tracing:
    the tool reports the error itself (the user's line first), and the log would bury it in the output."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _real_trace(tracer: _Tracer, size: int | None, asked: int | None) -> Trace:
    """One real step at batch `size`; its error says that batch, since the user asked for `asked`."""
    try:
        return tracer.trace(size, fake=False)
    except UserCodeError as exc:
        if exc.kind != "user_exception" or size is None or size == asked:
            raise
        asked_text = f"batch size {asked}" if asked else "the inputs' own batch"
        raise UserCodeError(
            exc.kind,
            f"at batch size {size} (a real step, run because tracing at {asked_text} on fake tensors "
            f"failed; shapes in the error are batch {size}'s): {exc.message}",
        ) from exc


def _fallback(tracer: _Tracer, target: Target, batch: int | None, variable: bool, failure: str | None):
    """Real runs (no fake tensors): the batch asked for when small, else batches 2 and 3 extrapolated to it.

    With no batch size asked for, the estimate is for the batch the inputs function returns by itself,
    so that one real step is measured as it is (a line through other batches would report another batch,
    and a graph's node count or a sequence length need not scale linearly)."""
    _check_room_for_real_runs(tracer, failure)
    if batch is None or not variable or batch <= FALLBACK_BATCHES[-1]:
        trace = tracer.trace(batch, fake=False)
        est = estimate_trace(trace, target)
        detail = f"one real step at batch size {trace.batch_size} on {tracer.device}, measured with the storage ledger"
        return (
            trace,
            est,
            "measured",
            detail,
            _line_runner(tracer, target, batch) if variable else lambda b: est,
        )
    small, large = (_real_trace(tracer, b, batch) for b in FALLBACK_BATCHES)
    e_small, e_large = estimate_trace(small, target), estimate_trace(large, target)
    est = extrapolate(e_small, e_large, batch, target.capacity_bytes)
    detail = (
        f"real steps at batch sizes {FALLBACK_BATCHES[0]} and {FALLBACK_BATCHES[1]} on {tracer.device}, measured with the "
        f"storage ledger, extrapolated linearly to batch size {batch}"
    )

    def runner(b: int) -> Estimate:
        return extrapolate(e_small, e_large, b, target.capacity_bytes)

    return large, est, "extrapolated", detail, runner


def _line_runner(tracer: _Tracer, target: Target, asked: int | None):
    """For the batch-size search after a measured step: the line through real steps at FALLBACK_BATCHES,
    run only when the search asks for a batch."""
    line: list[Estimate] = []

    def runner(b: int) -> Estimate:
        if not line:
            line.extend(estimate_trace(_real_trace(tracer, s, asked), target) for s in FALLBACK_BATCHES)
        return extrapolate(line[0], line[1], b, target.capacity_bytes)

    return runner


def _activations_dominate(request: EstimateMemoryRequest, est: Estimate) -> bool:
    """The condition of the activations_dominate finding, before checkpointing is asked for."""
    return (
        request.mode == "train"
        and not request.checkpoint_classes
        and est.breakdown.get("activations", 0) >= DOMINANT_SHARE * max(1, est.peak_allocated)
    )


def _checkpoint_options(
    tracer: _Tracer, trace: Trace, est: Estimate, target: Target, batch: int | None, *, fake: bool
) -> list[CheckpointOption]:
    """Each candidate block class checkpointed in turn, estimated the way the step itself was (lowest peak first).

    A candidate whose checkpointed step fails (a block whose forward checkpoint cannot wrap) is left out."""
    options = []
    for cls in checkpoint_candidates(trace.module_types, est.saved_by_module):
        spec = replace(tracer.spec, checkpoint_classes=(cls,))
        try:
            other = _Tracer(tracer.request, tracer.job, spec, tracer.device, tracer.probe_scratch)
            peak = estimate_trace(other.trace(batch, fake=fake), target).peak_allocated
        except UserCodeError:
            continue
        options.append(CheckpointOption(block_class=cls, peak_allocated_bytes=peak))
    return sorted(options, key=lambda o: o.peak_allocated_bytes)


def _failed_phase(exc: UserCodeError) -> str:
    for prefix, phase in (
        ("calling the model factory", "the model factory"),
        ("calling the inputs function", "the inputs function"),
        ("calling the loss function", "the loss function"),
    ):
        if exc.message.startswith(prefix):
            return phase
    return "the step (forward, loss or backward)"


def model_parameter_bytes(tracer: _Tracer) -> int | None:
    """Parameter bytes of the user's model without allocating it: fake tensors, else the meta device.

    Both constructions run under fake_safe_construction; None only when the factory fails both ways."""
    try:
        mode = fake_mode()
        with mode, fake_safe_construction():
            model = tracer.build()
    except Exception:
        try:
            with torch.device("meta"), fake_safe_construction():
                model = tracer.build()
        except Exception:
            return None
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _check_room_for_real_runs(tracer: _Tracer, failure: str | None) -> None:
    """Refuse real runs that would not fit in this process's memory (always runs before a real step)."""
    param_bytes = model_parameter_bytes(tracer)
    if param_bytes is None:  # the child's memory limit (RLIMIT_AS on CPU, the watchdog on CUDA) still holds
        return
    need = param_bytes * (4 if tracer.request.mode == "train" else 1) + (1 << 30)
    room = _memory_room_bytes()
    if room is not None and need > room:
        raise UserCodeError(
            "user_exception",
            f"tracing the step on fake tensors failed ({failure}), and the model ({param_bytes / 2**30:.1f} GiB of "
            f"parameters) is too large to measure for real here ({room / 2**30:.1f} GiB available). Make that "
            "code traceable (no .item(), .tolist() or `if tensor:` on values computed from the model's tensors) "
            "or run the estimate on a machine with more memory.",
        )


def _memory_room_bytes() -> int | None:
    limits = []
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft not in (resource.RLIM_INFINITY, -1):
        limits.append(soft)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    return min(limits) if limits else None


# -- the result -------------------------------------------------------------------------------
def _result(
    request,
    trace: Trace,
    est: Estimate,
    single,
    method,
    detail,
    failure,
    device,
    capacity,
    search,
    grad_extra,
    options,
):
    breakdown = MemoryBreakdown(**est.breakdown)
    savers = sorted(est.saved_by_module.items(), key=lambda kv: -kv[1])[:TOP_SAVERS]
    top = [
        ActivationSaver(module=m, type=trace.module_types.get(m, ""), saved_bytes=b)
        for m, b in savers
        if b > 0
    ]
    assumptions = _assumptions(request, trace, est, device)
    top_saver = (top[0].module, top[0].type) if top else None
    facts = Facts(
        request=request,
        method=method,
        trace_failure=failure,
        traced_on=str(device),
        peak_allocated=est.peak_allocated,
        peak_reserved=est.peak_reserved,
        device_bytes=est.device_bytes,
        breakdown=breakdown,
        phase=est.phase,
        module=est.module,
        fits=est.fits,
        capacity=capacity,
        max_batch_size=search.batch_size,
        top_saver=top_saver,
        checkpoint_candidate=_block_class(trace, top),
        checkpoint_options=[(o.block_class, o.peak_allocated_bytes) for o in options],
        grad_accum_extra=max(0, grad_extra),
        kernels_not_probed=trace.kernels_not_probed,
    )
    return EstimateMemoryResult(
        method=method,
        method_detail=detail,
        target_device=request.target_device,
        traced_on=str(device),
        mode=request.mode,
        precision=request.precision,
        optimizer=request.optimizer if request.mode == "train" else "none",
        batch_size=est.batch_size,
        world_size=request.world_size,
        sharding=request.sharding,
        peak_allocated_bytes=est.peak_allocated,
        peak_reserved_bytes=est.peak_reserved,
        cuda_context_bytes=est.context_bytes,
        peak_device_bytes=est.device_bytes,
        peak_tensor_bytes=est.peak_tensor_bytes,
        breakdown=breakdown,
        peak_phase=est.phase
        if est.phase in ("forward", "backward", "optimizer_step", "setup", "end")
        else "setup",
        peak_module=est.module,
        peak_op=est.op,
        phase_peaks=est.phase_peaks,
        activation_bytes=est.activation_bytes,
        top_activation_modules=top,
        single_device_peak_allocated_bytes=single.peak_allocated if single is not None else None,
        parameter_count=trace.param_count,
        trainable_parameter_count=trace.trainable_param_count,
        parameter_bytes=trace.param_bytes,
        cublas_workspace_bytes=est.workspace_bytes,
        kernel_scratch_bytes=est.scratch_bytes,
        checkpointing_options=options,
        device_memory_bytes=capacity,
        fits=est.fits,
        headroom_bytes=(capacity - est.device_bytes) if capacity is not None else None,
        max_batch_size=search.batch_size,
        max_batch_size_method=search.method,
        batch_sizes_traced=[TracedBatch(batch_size=b, device_bytes=n) for b, n in search.traced.items()],
        gradient_accumulation=request.gradient_accumulation,
        assumptions=assumptions,
        findings=memory_findings(facts),
        summary=memory_summary(facts),
    )


def _assumptions(
    request: EstimateMemoryRequest, trace: Trace, est: Estimate, device: torch.device
) -> list[str]:
    out = [
        "steady-state step: optimizer state already exists (created by an untraced warm-up step); "
        "output and loss stay alive until the step ends; zero_grad(set_to_none=True) after the step",
    ]
    if request.target_device == "cuda":
        out += [
            "CUDA caching allocator with default settings: 512 B rounding, 2 MiB segments for requests <= 1 MiB, "
            "20 MiB segments for 1-10 MiB, larger ones rounded to 2 MiB, best-fit reuse and splitting "
            "(c10/cuda/CUDACachingAllocator.cpp)",
            f"CUDA context: {est.context_bytes // 2**20} MiB as measured on an H100 with CUDA 13 (300-700 MiB by GPU and driver), outside memory_reserved()",
            "optimizer uses the foreach implementation (CUDA's default when fused=False)",
        ]
        if est.workspace_bytes:
            out.append(
                f"cuBLAS workspaces: {est.workspace_bytes} B (8.125 MiB per thread, 32 MiB on Hopper; forward and backward threads; "
                "plus 1 MiB of cuBLASLt workspace per thread that runs a biased matmul)"
            )
    else:
        out.append(
            "CPU: exact storage bytes (the CPU allocator does not round or cache); for-loop optimizer (the CPU default)"
        )
    if request.precision in ("bf16", "fp16"):
        out.append(
            f"model cast to {request.precision}: parameters, gradients and optimizer state in {request.precision}"
        )
    if request.precision == "fp16_autocast":
        out.append("GradScaler's few scalars are not counted; unscale_ works in place")
    if request.gradient_accumulation > 2:
        out.append("two micro-batches traced: later ones repeat the second's memory")
    if trace.kernels_probed:
        out.append(
            f"{trace.kernels_probed} convolution/RNN/attention kernel signatures were run once for real to measure scratch and workspace"
        )
    if trace.kernels_scaled:
        out.append(
            f"{trace.kernels_scaled} convolution signatures were over the probes' size or time budget: their scratch "
            "was measured at batch sizes 2 and 3 and extrapolated linearly"
        )
    if trace.kernel_gpu:
        out.append(
            f"CUDA kernel scratch (reductions over outer dims, e.g. bias gradients) sized for {trace.kernel_gpu}'s SM count"
        )
    out += est.assumptions
    return out


def _block_class(trace: Trace, top: list[ActivationSaver]) -> str | None:
    """The class of the repeated block that contains the top activation saver, if any."""
    if not top or not top[0].type or top[0].module in ("", "(root)"):  # the root module itself: no block
        return None
    units = [
        name
        for name in trace.fsdp_units
        if name != "(root)" and trace.module_types.get(name) not in NO_FORWARD  # a ModuleList has no forward
    ]
    for unit in units:
        if top[0].module == unit or top[0].module.startswith(unit + "."):
            return trace.module_types.get(unit)
    if top[0].type in NO_FORWARD:
        return None
    return top[0].type or None


def _traced_detail(trace: Trace, device: torch.device) -> str:
    return (
        f"one step traced on fake {device} tensors ({trace.op_count} aten ops, {trace.param_count} parameters), "
        "live storage bytes followed op by op"
    )


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "unknown error"
    return line[:400]


def prewarm() -> None:
    """Run a tiny fake step once in the warm worker, so forked children skip FakeTensorMode's first-use cost."""
    if os.environ.get("TORCH_SKILLS_NO_PREWARM"):
        return
    spec = StepSpec(optimizer="adamw", foreach=True)
    trace_step(
        lambda: torch.nn.Linear(4, 4), lambda b: torch.zeros(2, 4), lambda out, b: out.float().mean(), spec
    )


prewarm()

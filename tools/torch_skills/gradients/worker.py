"""check_gradients, worker side: `run(request, job)` inside a forked child of the warm worker.

The server calls it as `run_in_worker(ctx, "torch_skills.gradients.worker:run", request, ...)`; tests
may call it in-process with a `torch_skills.runner.child.JobContext`.

Model mode runs one training step without the optimizer:
  1. build the model and one batch; scan parameters and batch for NaN/Inf;
  2. pass 1: forward with cheap hooks (`probe`), the loss, backward; per-parameter statistics;
  3. pass 2, only when pass 1 saw a non-finite value or parameters cut off from the loss: the
     same step again (same seed) under the op tracer and autograd-node hooks (`trace`), which
     name the op, module, source line and autograd node;
  4. findings and summary (`findings`). Zero or missing gradients are first checked against what is
     zero by design (`bydesign`: embedding rows no token used, modules skipped at random, rerun
     under other seeds), and the loss's graph for a softmax/sigmoid feeding a logits loss
     (`lossinput`); a NaN/Inf's op gets the measured state of its operands (`causes`).
Gradcheck mode (`function=...`) runs `torch_skills.gradients.gradcheck` instead.

Known limitations: one batch and one step, without the optimizer, so problems that need many
steps to appear (a learning rate that diverges after 500 steps) show only as large gradients
or ratios; the thresholds in GradientThresholds are heuristics; dead-activation statistics cover
ReLU-family modules, not F.relu calls; models whose forward changes state between calls may not
reproduce a NaN in the traced rerun (reported as located_by='not_reproduced').
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torch_skills.gradients import analysis
from torch_skills.gradients.bydesign import (
    embedding_names,
    embedding_rows,
    stochastic_skips,
    stochastic_zero_grads,
)
from torch_skills.gradients.findings import diagnose
from torch_skills.gradients.gradcheck import bind, check_function, prepare_arguments
from torch_skills.gradients.lossinput import loss_inputs
from torch_skills.gradients.models import (
    ByDesignZeros,
    GradientRequest,
    GradientResult,
    GradientThresholds,
    LossInfo,
    NonfiniteLocation,
    StepTimings,
)
from torch_skills.gradients.probe import ForwardProbe
from torch_skills.gradients.tensors import dtype_name, is_finite, kind_of, tensors_in
from torch_skills.gradients.trace import BackwardWatch, OpTracer, graph_nodes
from torch_skills.gradients.zeroinit import zero_init_gated
from torch_skills.runner.child import JobContext
from torch_skills.runner.errors import UserCodeError
from torch_skills.runner.usercode import (
    build_model,
    call_model,
    compute_loss,
    describe_rule,
    load_callable,
    make_batch,
    resolve_device,
    user_code,
)

STEPS = 4  # progress: build, pass 1, pass 2, analysis


@contextlib.contextmanager
def _timed(timings: StepTimings, field: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        setattr(timings, field, getattr(timings, field) + time.perf_counter() - start)


def run(request: GradientRequest, job: JobContext) -> GradientResult:
    """Entry point (see the module docstring)."""
    if request.function is not None:
        return check_function_request(request, job)
    return check_model(request, job)


# ------------------------------------------------------------------------------------------------
# Model mode
# ------------------------------------------------------------------------------------------------
@dataclass
class Step:
    """One training step to examine: the model, its batch, and how to turn an output into a loss."""

    model: nn.Module
    batch: Any
    loss_of: Callable[[Any], tuple[torch.Tensor, str]]  # output -> (scalar loss, how it was computed)
    seed: int
    cwd: Path


def check_model(request: GradientRequest, job: JobContext) -> GradientResult:
    assert request.model is not None
    timings = StepTimings()
    device = resolve_device(job.device)
    job.progress(0, STEPS, "building the model")
    torch.manual_seed(request.seed)  # the same weights on every call, whatever ran in the worker before
    with _timed(timings, "build_s"):
        model = build_model(request, job.cwd, job.allowed_roots, device)
    with _timed(timings, "inputs_s"):
        batch = make_batch(request, job.cwd, job.allowed_roots, device)
    model.train(request.train_mode)
    step = Step(
        model,
        batch,
        lambda output: compute_loss(request, job.cwd, job.allowed_roots, output, batch, model),
        request.seed,
        job.cwd,
    )
    return examine(step, request.model, request.thresholds, timings, job.progress)


def examine(
    step: Step,
    target: str,
    thresholds: GradientThresholds,
    timings: StepTimings,
    progress: Callable[[float, float | None, str | None], None],
) -> GradientResult:
    """Pass 1, statistics, pass 2 when needed, findings (see the module docstring)."""
    model = step.model
    known = analysis.first_nonfinite_parameter(model) or _nonfinite_batch(step.batch)
    result = GradientResult(mode="model", target=target, thresholds=thresholds, timings=timings, summary="")

    progress(1, STEPS, "forward and backward")
    torch.manual_seed(step.seed)
    with _timed(timings, "forward_s"), ForwardProbe(model) as probe:
        with user_code("the forward pass"):
            output = call_model(model, step.batch)
        loss, how = step.loss_of(output)
    result.loss = _describe_loss(loss, how)
    result.batch_rule = describe_rule(model, step.batch, how)
    if loss.requires_grad:
        nodes, _ = graph_nodes(loss.grad_fn)  # one walk of the graph for both checks
        result.custom_functions = _custom_functions(nodes, step.cwd)
        result.loss_inputs = loss_inputs(nodes)
        del nodes
        with _timed(timings, "backward_s"), user_code("the backward pass"):
            loss.backward()
    bad_output = next((t for t in tensors_in(output) if not is_finite(t)), None)
    output_finite = bad_output is None
    first_bad = bad_output if bad_output is not None else (loss if not result.loss.finite else None)
    first_kind = kind_of(first_bad) if first_bad is not None else None
    del output, loss, bad_output, first_bad

    result.parameters = analysis.parameter_gradients(model, thresholds)
    result.total_grad_norm = analysis.total_grad_norm(result.parameters)
    result.frozen_parameters = [p.name for p in result.parameters if "frozen" in p.flags]
    result.unused_parameters = [p.name for p in result.parameters if "no_grad" in p.flags]
    result.depth_profile = analysis.depth_profile(
        model, result.parameters, probe.activity, thresholds, embedding_names(model)
    )
    result.activations = probe.activation_stats()
    result.by_design_zeros = embedding_rows(model)
    if result.loss.requires_grad:
        result.graph_breaks = analysis.graph_breaks(model, result.parameters, probe.activity)
        ran_before = {name for name, record in probe.activity.items() if record.calls}
        _find_stochastic_skips(step, result, ran_before)
    finite_grads = not any("nonfinite_grad" in p.flags for p in result.parameters)
    if known is None and output_finite and result.loss.finite and finite_grads:
        gated = set(zero_init_gated(step, result.parameters))
        for p in result.parameters:
            if p.name in gated:
                p.flags = ["zero_init_gated" if f == "zero_grad" else f for f in p.flags]
        result.zero_init_gated = [p.name for p in result.parameters if p.name in gated]
        _find_stochastic_zero_grads(step, result)

    grads_finite = not any("nonfinite_grad" in p.flags for p in result.parameters)
    need_values = known is None and not (output_finite and result.loss.finite)
    need_backward = known is None and output_finite and result.loss.finite and not grads_finite
    need_cuts = any(b.cause == "output_unused" for b in result.graph_breaks)
    result.nonfinite = known
    if need_values or need_backward or need_cuts:
        progress(2, STEPS, "locating the problem (traced rerun)")
        with _timed(timings, "localize_s"):
            _localize(step, result, need_values, need_backward, need_cuts)
        if (need_values or need_backward) and result.nonfinite is None:
            result.nonfinite = NonfiniteLocation(
                phase="forward" if not output_finite else "loss" if not result.loss.finite else "backward",
                module=None,
                kind=first_kind or _first_grad_kind(model),  # type: ignore[arg-type]
                located_by="not_reproduced",
            )

    progress(3, STEPS, "analysing")
    return diagnose(result)


def _find_stochastic_skips(step: Step, result: GradientResult, ran_before: set[str]) -> None:
    """Re-label 'never ran' modules that other seeds run (LayerDrop, stochastic depth).

    A module counts when it, or an ancestor that also did not run (the skipped layer around a
    submodule whose weights are read directly, like MultiheadAttention's out_proj), runs with
    another seed."""
    never_ran = [b for b in result.graph_breaks if b.cause == "never_ran"]
    if not never_ran or not step.model.training:
        return
    candidates: dict[str, list[str]] = {}
    for b in never_ran:
        parts = b.module.split(".")
        chain = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
        candidates[b.module] = [name for name in chain if name and name not in ran_before]
    ran = stochastic_skips(step, sorted({n for names in candidates.values() for n in names}))
    skipped: dict[str, ByDesignZeros] = {}  # by the module that was skipped
    modules = dict(step.model.named_modules())
    for b in never_ran:
        hit = next((n for n in reversed(candidates[b.module]) if n in ran), None)  # the outermost skipped
        if hit is None:
            continue
        b.cause = "stochastic_skip"
        if hit in skipped:
            skipped[hit].parameters += b.parameters
            continue
        runs, tried = ran[hit]
        skipped[hit] = ByDesignZeros(
            module=hit,
            module_type=type(modules[hit]).__name__,
            kind="stochastic_skip",
            parameters=list(b.parameters),
            detail=f"did not run with seed {step.seed}, ran with {runs} of the {tried} other seeds tried",
        )
    result.by_design_zeros += skipped.values()


def _find_stochastic_zero_grads(step: Step, result: GradientResult) -> None:
    """Re-flag all-zero gradients that other seeds make non-zero (stochastic depth multiplying by 0)."""
    zero = [p.name for p in result.parameters if "zero_grad" in p.flags]
    if not zero or not step.model.training:
        return
    woke = stochastic_zero_grads(step, zero)
    by_owner: dict[str, ByDesignZeros] = {}
    modules = dict(step.model.named_modules())
    for p in result.parameters:
        if p.name not in woke:
            continue
        p.flags = ["stochastic_zero_grad" if f == "zero_grad" else f for f in p.flags]
        owner = analysis.owner_of(p.name)
        if owner in by_owner:
            by_owner[owner].parameters.append(p.name)
            continue
        runs, tried = woke[p.name]
        by_owner[owner] = ByDesignZeros(
            module=owner,
            module_type=type(modules[owner]).__name__,
            kind="stochastic_skip",
            parameters=[p.name],
            detail=f"got an all-zero gradient with seed {step.seed}, a non-zero one with {runs} of the {tried} "
            "other seeds tried",
        )
    result.by_design_zeros += by_owner.values()


def _describe_loss(loss: torch.Tensor, how: str) -> LossInfo:
    value = float(loss.detach().float())
    finite = is_finite(loss)
    return LossInfo(
        value=value if finite else None,
        text=f"{value:.6g}",
        finite=finite,
        requires_grad=loss.requires_grad,
        how=how,
    )


def _first_grad_kind(model: nn.Module) -> str:
    for p in model.parameters():
        if p.grad is not None and not is_finite(p.grad):
            return kind_of(p.grad)
    return "nan"


def _nonfinite_batch(batch: Any) -> NonfiniteLocation | None:
    for t in tensors_in(batch):
        if not is_finite(t):
            return NonfiniteLocation(
                phase="input", module=None, kind=kind_of(t), dtype=dtype_name(t), located_by="input_scan"
            )
    return None


def _custom_functions(nodes: list[Any], cwd: Path) -> list[str]:
    """Custom autograd Functions among the graph's nodes (their backward nodes are BackwardCFunction subclasses)."""
    types = {type(n) for n in nodes if isinstance(n, torch.autograd.function.BackwardCFunction)}
    return sorted(function_reference(t, cwd) or t.__name__ for t in types)


def _localize(
    step: Step, result: GradientResult, need_values: bool, need_backward: bool, need_cuts: bool
) -> None:
    """Pass 2: rerun the step under the tracer and fill in `result.nonfinite` and graph-break sources."""
    model = step.model
    model.zero_grad(set_to_none=True)
    tracer = OpTracer(
        model, step.cwd, watch_values=need_values, watch_cuts=need_cuts, watch_nodes=need_backward
    )
    torch.manual_seed(step.seed)
    try:
        with tracer:
            with user_code("the forward pass (traced rerun)"):
                output = call_model(model, step.batch)
            tracer.phase = "loss"
            loss, _ = step.loss_of(output)
        if need_values:
            bad_output = next((t for t in tensors_in(output) if not is_finite(t)), None)
            where = tracer.origin_of(bad_output if bad_output is not None else loss)
            result.nonfinite = where or tracer.module_fallback or tracer.first_created
        if need_backward and loss.requires_grad:
            with BackwardWatch(loss, tracer) as watch, user_code("the backward pass (traced rerun)"):
                loss.backward()
            result.nonfinite = watch.location
        if need_cuts:
            params = dict(model.named_parameters())
            for b in result.graph_breaks:
                if b.cause != "output_unused":
                    continue
                cut = tracer.cut_reaching([params[n] for n in b.parameters])
                if cut is not None:
                    b.cause = "detached"
                    b.source = cut.source
    finally:
        tracer.release()


# ------------------------------------------------------------------------------------------------
# Gradcheck mode
# ------------------------------------------------------------------------------------------------
def check_function_request(request: GradientRequest, job: JobContext) -> GradientResult:
    assert request.function is not None
    timings = StepTimings()
    device = resolve_device(job.device)
    job.progress(0, 2, "loading the function")
    with _timed(timings, "build_s"):
        target = load_callable(request.function, job.cwd, job.allowed_roots, "the function", role="function")
    if inspect.isclass(target) and issubclass(target, torch.autograd.Function):
        fn, kind = target.apply, "autograd.Function"
    elif inspect.isclass(target):
        raise UserCodeError(
            "bad_request",
            f"{request.function} is a class but not a torch.autograd.Function subclass; pass the Function, or a "
            "plain function that calls it",
        )
    else:
        fn, kind = target, "callable"
    with _timed(timings, "inputs_s"):
        batch = make_batch(request, job.cwd, job.allowed_roots, device)
    args, keys = prepare_arguments(batch)
    call = bind(fn, keys)
    with user_code(f"calling {request.function}"):
        call(*args)
    job.progress(1, 2, "gradcheck")
    with _timed(timings, "gradcheck_s"):
        report = check_function(
            call,
            args,
            name=request.function,
            kind=kind,
            fast_mode=request.fast_mode,
            second_order=request.gradgradcheck,
        )
    result = GradientResult(
        mode="gradcheck",
        target=request.function,
        gradcheck=report,
        thresholds=request.thresholds,
        timings=timings,
        summary="",
    )
    return diagnose(result)


def function_reference(node_type: type, cwd: Path) -> str | None:
    """'file.py:MyFunction' for a custom Function's backward node class, for the gradcheck hint."""
    forward_cls = getattr(node_type, "_forward_cls", None)
    if forward_cls is None:
        return None
    try:
        path = Path(inspect.getfile(forward_cls)).resolve()
    except (TypeError, OSError):
        return None
    try:
        path = path.relative_to(cwd.resolve())
    except ValueError:
        pass
    return f"{path}:{forward_cls.__qualname__}"


# ------------------------------------------------------------------------------------------------
# Warm-up in the zygote
# ------------------------------------------------------------------------------------------------
class _WarmUpNet(nn.Module):
    """Tiny net whose `log` makes -inf on request: exercises both passes of the model check."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)
        self.make_nan = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.proj(x))
        return self.head(torch.log(h) if self.make_nan else h)


def warm_up() -> None:
    """Run every code path once on tiny tensors, so each forked child starts with them loaded.

    The zygote calls this after importing the module (see torch_skills.runner.zygote). Without it each
    child pays the first-use costs (lazy imports, dispatcher and kernel set-up) again: measured at
    about 10 ms of a 24 ms call on a 64-128-10 MLP. Tensors stay far below torch's parallel grain
    size, so no OpenMP threads exist before the fork.
    """
    here = Path.cwd()
    net = _WarmUpNet()
    batch = torch.randn(3, 4)  # (B, 4)

    def default_loss(output: Any) -> tuple[torch.Tensor, str]:
        return output.mean(), "mean of the output"

    for make_nan in (False, True):
        net.make_nan = make_nan
        net.zero_grad(set_to_none=True)
        step = Step(net, batch, default_loss, 0, here)
        examine(step, "warm-up", GradientThresholds(), StepTimings(), lambda *_: None).model_dump(mode="json")

    class _Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            (x,) = ctx.saved_tensors
            return 2 * x * grad

    args, _ = prepare_arguments(torch.randn(2))
    check_function(
        _Square.apply, args, name="warm-up", kind="autograd.Function", fast_mode=False, second_order=True
    )

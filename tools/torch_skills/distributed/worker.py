"""check_distributed, worker side: `run(request, job)` inside the job child the warm worker forked.

The server calls it as `run_in_worker(ctx, "torch_skills.distributed.worker:run", request, ...)`.
  0. import the user's modules (not call them): the ranks inherit them;
  1. fork `world_size` ranks (`launch`); each joins a gloo (cpu) or nccl (cuda) process group on a
     FileStore in this job's own folder, builds the model, wraps it (DDP or FSDP2 fully_shard),
     runs a probe step in eval mode and `steps` training steps with its share of the data (`rank`);
  2. read what the ranks left and compare them (`findings`);
  3. compare the probe step's distributed gradient with one process on the same global batch,
     here, after the ranks are gone (no thread exists before the fork).

Known limitations: DDP runs with find_unused_parameters=True so a model with unused parameters
still completes every step (the finding says what plain DDP does); the optimizer is plain SGD; the
gradient comparison runs in eval mode (dropout off, BatchNorm on running statistics); under FSDP
only buffers and unsharded parameters are compared across ranks.
"""

from __future__ import annotations

import shutil
from typing import Any

import torch
import torch._dynamo  # noqa: F401 - DDP's constructor imports it (~2 s, 800 modules): preload it

try:  # what every rank uses, imported once in the warm worker; absent from builds without distributed
    import torch.distributed.fsdp  # noqa: F401
    import torch.nn.parallel.distributed  # noqa: F401
except ImportError:
    pass

from torch_skills.distributed import findings as F
from torch_skills.distributed.launch import launch
from torch_skills.distributed.models import (
    DistributedFinding,
    DistributedRequest,
    DistributedResult,
    GradientCheck,
    MemoryReport,
)
from torch_skills.distributed.rank import Plan
from torch_skills.results import BatchRule
from torch_skills.runner.child import JobContext
from torch_skills.runner.errors import UserCodeError
from torch_skills.runner.threads import rank_threads
from torch_skills.runner.usercode import build_model, compute_loss, load_callable, split_batch, user_code

SKILL = F.SKILL
GRAD_TOL = 1e-3  # relative difference below this is float summation order, not a bug
UNIFORM_TOL = 0.02  # ratios within 2% of their median are one uniform factor


def _device(request: DistributedRequest, job: JobContext) -> str:
    if request.device == "cuda" or (request.device == "auto" and job.device == "cuda"):
        if not torch.cuda.is_available():
            raise UserCodeError("bad_request", "device='cuda' but this machine has no CUDA device; use 'cpu'")
        if torch.cuda.device_count() < request.world_size:
            raise UserCodeError(
                "bad_request",
                f"world_size={request.world_size} needs as many GPUs for nccl; this machine has "
                f"{torch.cuda.device_count()}: lower world_size or use device='cpu' (gloo)",
            )
        return "cuda"
    return "cpu"


def run(request: DistributedRequest, job: JobContext) -> DistributedResult:
    """Entry point (see the module docstring)."""
    import torch.distributed as dist

    if not dist.is_available():
        raise UserCodeError(
            "bad_request", "this torch build has no torch.distributed; install a build with it"
        )
    device = _device(request, job)
    shape = request.input_shape
    if request.data is None and request.inputs is None and shape and shape[0] % request.world_size:
        raise UserCodeError(
            "bad_request",
            f"input_shape[0]={shape[0]} is the global batch and must split evenly over world_size="
            f"{request.world_size}; use a multiple of {request.world_size}, e.g. "
            f"{[shape[0] - shape[0] % request.world_size or request.world_size, *shape[1:]]}",
        )
    # Import the user's modules here, once, so every rank starts with them (a transformers import is
    # seconds); the factories themselves are called in the ranks. A bad reference fails before any fork.
    for reference, what, role in (
        (request.model, "the model factory", "model"),
        (request.inputs, "the inputs function", "inputs"),
        (request.loss, "the loss function", "loss"),
        (request.data, "the data loader factory", "data"),
    ):
        if reference is not None:
            load_callable(reference, job.cwd, job.allowed_roots, what, role=role)
    folder = job.job_dir / "dist"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    job.cpu_threads = rank_threads(request.cpu_threads, job.cpu_threads, request.world_size)
    plan = Plan(request, folder, job.cwd, job.allowed_roots, device, job.cpu_threads)
    job.progress(0, 3, f"running {request.world_size} ranks ({request.strategy}, {device})")
    exits = launch(plan)
    job.progress(1, 3, "comparing the ranks")
    ranks = F.RankFiles.read(plan, exits)
    _raise_setup_errors(ranks)
    failures = F.failure_findings(ranks)
    culprits = {r for f in failures for r in f.ranks}
    findings: list[DistributedFinding] = []
    mismatch = F.mismatch_findings(ranks, culprits)
    findings += mismatch
    if mismatch and all(r.waited for r in ranks if not r.ok):
        failures = []  # the ranks only timed out in the mismatched collective: the mismatch says it all
    findings += failures
    findings += F.unused_findings(ranks, request.strategy)
    findings += F.divergence_findings(plan, ranks, request.strategy)
    data_found, data_report, notes = F.data_findings(ranks, request.world_size)
    findings += data_found
    grad_check = None
    if all(r.ok for r in ranks):
        job.progress(2, 3, "one process on the global batch")
        grad_check, grad_findings = gradient_check(plan, request, job)
        findings += grad_findings
    first_ok = next((r.result for r in ranks if r.result is not None), None)
    if first_ok and first_ok.get("batchnorm"):
        notes.append(
            f"BatchNorm layers ({', '.join(first_ok['batchnorm'][:4])}) normalize each rank's local batch "
            "in training, so their statistics (and gradients) depend on the per-rank batch size; expected, "
            "not flagged (gradients are compared in eval mode). For global statistics use "
            "nn.SyncBatchNorm.convert_sync_batchnorm(model)."
        )
    reports = [r.report() for r in ranks]
    completed = min((len(r.steps) for r in reports), default=0)
    memory = None
    if request.strategy == "fsdp" or device == "cuda":
        job.progress(2.5, 3, "estimate_memory for the same model and strategy")
        estimate, why = _sharded_estimate(request, job, device)
        memory = MemoryReport(
            per_rank_peak_bytes=[r.peak_memory_bytes for r in reports],
            estimate_bytes=estimate,
            note="measured: cuda: torch.cuda.max_memory_allocated per rank; cpu: peak resident memory each "
            "rank added after its fork (tensors plus allocator, gloo and Python overhead). estimate: "
            f"estimate_memory's per-rank peak of tensor bytes for sharding={request.strategy!r}, "
            f"world_size={request.world_size}, SGD, the per-rank batch{why}",
        )
    buckets = first_ok.get("buckets") if first_ok and request.strategy == "ddp" else None
    rule = BatchRule.model_validate(first_ok["batch_rule"]) if first_ok and "batch_rule" in first_ok else None
    findings.sort(key=lambda f: {"error": 0, "warning": 1, "info": 2}[f.severity])
    return DistributedResult(
        target=request.model,
        strategy=request.strategy,
        world_size=request.world_size,
        backend="nccl" if device == "cuda" else "gloo",
        steps_requested=request.steps,
        steps_completed=completed,
        findings=findings,
        ranks=reports,
        ddp_buckets=buckets,
        gradient_check=grad_check,
        data=data_report,
        memory=memory,
        batch_rule=rule,
        notes=notes,
        summary=_summary(request, findings, completed),
    )


SETUP_PHASES = ("joining the process group", "building the model", "wrapping the model")


def _raise_setup_errors(ranks: list[F.RankFiles]) -> None:
    """Errors the caller fixes by calling differently are tool errors, not findings: a refused or
    broken reference, a factory that returns no module, a batch that does not split, or the same
    exception on every rank before the first step (a bug of the model, not of the distribution)."""
    errors = [r.error for r in ranks if r.error]
    for e in errors:
        if e.get("kind") in ("bad_request", "import_error"):
            raise UserCodeError(e["kind"], e["message"])
    same = len(errors) == len(ranks) and len({e.get("message") for e in errors}) == 1
    if same and ranks[0].status.startswith(SETUP_PHASES):
        raise UserCodeError(
            "user_exception", f"every rank failed while {ranks[0].status}: {errors[0]['message']}"
        )


def _sharded_estimate(request: DistributedRequest, job: JobContext, device: str) -> tuple[int | None, str]:
    """(estimate_memory's per-rank peak allocated bytes for this run, '' or why there is none)."""
    if request.data is not None or request.input_shape is None and request.inputs is None:
        return None, " (not computed: estimate_memory takes inputs or input_shape, not a loader)"
    from torch_skills.memory.models import EstimateMemoryRequest
    from torch_skills.memory.worker import run as estimate

    batch = (
        request.input_shape[0] // request.world_size
        if request.inputs is None and request.input_shape
        else None
    )
    try:
        est = estimate(
            EstimateMemoryRequest(
                model=request.model,
                model_kwargs=request.model_kwargs,
                inputs=request.inputs,
                input_shape=request.input_shape,
                input_dtype=request.input_dtype,
                loss=request.loss,
                device="cpu",
                optimizer="sgd",
                batch_size=batch,
                sharding=request.strategy,
                world_size=request.world_size,
                target_device="cuda" if device == "cuda" else "cpu",
            ),
            job,
        )
    except Exception as e:  # the estimate is a comparison, never a reason to fail the check
        return None, f" (not computed: {type(e).__name__}: {str(e)[:200]})"
    return int(est.peak_allocated_bytes), ""


def _summary(request: DistributedRequest, findings: list[DistributedFinding], completed: int) -> str:
    head = f"{request.world_size} ranks, {request.strategy}, {completed}/{request.steps} steps completed"
    if not findings:
        return (
            f"{head}: no problem found (replicas identical, gradients match one process, collectives agree)."
        )
    kinds = ", ".join(dict.fromkeys(f.kind for f in findings))
    return f"{head}: {len(findings)} finding(s) ({kinds}). First: {findings[0].message}"


def _cat(parts: list[Any]) -> Any:
    """Join the ranks' local batches into the global one (tensors along dim 0)."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts) if first.dim() else first
    if isinstance(first, dict):
        return {k: _cat([p[k] for p in parts]) for k in first}
    if isinstance(first, (list, tuple)) and not hasattr(first, "_fields"):
        return type(first)(_cat([p[i] for p in parts]) for i in range(len(first)))
    return first


def gradient_check(
    plan: Plan, request: DistributedRequest, job: JobContext
) -> tuple[GradientCheck | None, list[DistributedFinding]]:
    """The probe step's distributed gradient against one process on the concatenated global batch."""
    world = request.world_size
    probes = [torch.load(plan.path(r, "probe.pt"), weights_only=True) for r in range(world)]
    batch = _cat([p["batch"] for p in probes])
    if request.strategy == "fsdp":
        dist_grads = {
            n: torch.cat([p["grads"][n] for p in probes if n in p["grads"]]) for n in probes[0]["grads"]
        }
    else:
        dist_grads = probes[0]["grads"]
    torch.manual_seed(request.seed)
    model = build_model(request, plan.cwd, plan.roots, "cpu")
    model.eval()
    split = split_batch(model, batch)
    with user_code("the single-process reference: forward"):
        output = model(*split.args, **split.kwargs)
    loss, _ = compute_loss(request, plan.cwd, plan.roots, output, batch, model)
    with user_code("the single-process reference: backward"):
        loss.backward()
    ratios: list[float] = []
    worst = 0.0
    worst_name = None
    compared = 0
    for name, p in model.named_parameters():
        g1 = p.grad
        gd = dist_grads.get(name)
        if g1 is None or gd is None or g1.shape != gd.reshape(g1.shape).shape:
            continue
        gd = gd.reshape(g1.shape).float()
        n1 = float(g1.float().norm())
        nd = float(gd.norm())
        if n1 < 1e-12 and nd < 1e-12:
            continue
        compared += 1
        rel = float((g1.float() - gd).norm()) / max(n1, 1e-30)
        if rel > worst:
            worst, worst_name = rel, name
        if nd > 1e-30:
            ratios.append(n1 / nd)
    if not compared:
        return None, []
    ratios.sort()
    median = ratios[len(ratios) // 2] if ratios else None
    check = GradientCheck(
        parameters_compared=compared,
        ratio_median=median,
        ratio_min=ratios[0] if ratios else None,
        ratio_max=ratios[-1] if ratios else None,
        max_relative_difference=worst,
        note="probe step in eval mode; ratio = |one process on the global batch| / |averaged distributed "
        "gradient|; 1.0 means the distributed run computes the gradient of the same loss",
    )
    if worst <= GRAD_TOL or median is None:
        return check, []
    uniform = all(abs(r - median) <= UNIFORM_TOL * median for r in ratios)
    if uniform and abs(median - world) <= UNIFORM_TOL * world:
        finding = DistributedFinding(
            severity="error",
            kind="gradient_scale",
            code="summed_loss",
            measured={"ratio": median, "world_size": float(world)},
            message=f"the averaged gradient is {median:.3g}x smaller than one process on the same global batch, "
            f"uniformly across {compared} parameters: a factor of world_size={world}. The loss is summed over "
            "the batch (or divided by the local batch where the global one was meant), so the step size "
            "changes with the number of ranks.",
            fix="Use a mean-reduced loss (reduction='mean'), or divide the summed loss by the global batch "
            "size; DDP averages gradients over ranks, so a per-rank mean gives the global mean.",
            skill=SKILL,
        )
    elif uniform:
        finding = DistributedFinding(
            severity="warning",
            kind="gradient_scale",
            code="uniform_factor",
            measured={"ratio": median},
            message=f"the averaged gradient differs from one process on the same global batch by a uniform "
            f"factor {median:.3g} across {compared} parameters: the loss's normalization depends on the "
            "per-rank batch.",
            fix="Normalize the loss by a quantity that is the same on every rank (the global batch size or "
            "token count, all-reduced), not by a per-rank count.",
            skill=SKILL,
        )
    else:
        finding = DistributedFinding(
            severity="warning",
            kind="gradient_scale",
            code="gradient_mismatch",
            names=[worst_name] if worst_name else [],
            measured={"max_relative_difference": worst},
            message=f"the averaged gradient differs from one process on the same global batch, not by one "
            f"factor (worst: {worst_name}, relative difference {worst:.3g}): the loss or the model depends on "
            "the rank or on the per-rank batch beyond a mean.",
            fix="Look for per-rank normalization (a mean over a rank's tokens when ranks hold different "
            "counts), rank-dependent code in forward, or statistics over the local batch.",
            skill=SKILL,
        )
    return check, [finding]

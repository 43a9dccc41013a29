"""What the estimate means for the user: findings with the skill to read next, and a summary line.

Use: `findings = memory_findings(facts)`, `summary = memory_summary(facts)` where `facts` is the
`Facts` bundle the worker assembles. No torch here.

Thresholds are stated next to each rule; every finding names one specialist skill.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch_skills.memory.models import EstimateMemoryRequest, MemoryBreakdown
from torch_skills.results import Finding, format_bytes

DOMINANT_SHARE = 0.40  # a category holding this share of the peak is what to cut first
FRAGMENTATION_SHARE = 0.10  # reserved above allocated by this share is worth a setting
SPIKE_SHARE = 0.15  # temporaries at an optimizer-step peak above this share: foreach buffers


@dataclass
class Facts:
    request: EstimateMemoryRequest
    method: str
    trace_failure: str | None
    traced_on: str
    peak_allocated: int
    peak_reserved: int
    device_bytes: int
    breakdown: MemoryBreakdown
    phase: str
    module: str
    fits: bool | None
    capacity: int | None
    max_batch_size: int | None
    top_saver: tuple[str, str] | None  # (module, class) of the module saving the most activations
    checkpoint_candidate: str | None  # class of the repeated block to checkpoint
    grad_accum_extra: int  # bytes the extra micro-batch adds to the peak (gradients alive in forward)
    kernels_not_probed: int
    # (block class, the peak with it checkpointed), lowest peak first
    checkpoint_options: list[tuple[str, int]] = field(default_factory=list)


def _trace_advice(failure: str, method: str) -> str:
    """Whose the failure is and what, if anything, to change, by where and how tracing failed.

    Only called once the real runs succeeded: an error that is not a value read then exists only
    under fake tensors (a fake kernel that rejects what the real one runs), which is the tool's
    limit, not the user's bug."""
    in_library = "site-packages" in failure or "dist-packages" in failure
    if failure.startswith("the model factory"):
        return (
            "A constructor that reads values of a large tensor cannot be traced; compute such values with "
            "Python numbers (or a small torch.linspace/arange) to get a traced estimate."
        )
    if "reads a tensor's value" in failure or "output shape depends" in failure:
        if in_library:
            return (
                "That line is in an installed library, not in your code, so there is nothing for you to change: "
                "the real runs stand in for the trace. A branch drawn at random in forward (LayerDrop, stochastic "
                "depth) makes each real step a little different."
            )
        return (
            "Values read in forward (.item(), .tolist(), branching on a tensor) cannot be traced; move them out "
            "of forward to get a traced estimate."
        )
    same_batch = method == "measured"
    return (
        "The real step"
        + (" at the same batch size" if same_batch else "s at small batch sizes")
        + " ran without this error, so it exists only under fake tensors: a limit of the tool's tracing (torch's "
        "fake version of an op rejects what the real kernel runs), not a bug in your code"
        + (
            ". Nothing to fix."
            if same_batch
            else "; unless the error names shapes that only your requested batch size produces, nothing to fix."
        )
    )


def _checkpoint_advice(options: list[tuple[str, int]], peak: int) -> str:
    """Each estimated checkpointing choice with the peak it gives, the lowest first."""
    choices = "; ".join(
        f"activation_checkpointing=['{cls}'] gives a peak of {format_bytes(p)} ({(p - peak) / max(1, peak):+.0%})"
        for cls, p in options
    )
    best, best_peak = options[0]
    if best_peak >= peak:
        return (
            f"checkpointing the repeated blocks does not lower the peak here ({choices}): the peak is not where "
            "their activations are alive; lower the batch size / sequence length instead"
        )
    return f"wrap {best} in activation checkpointing (estimated: {choices})"


def memory_findings(f: Facts) -> list[Finding]:
    r = f.request
    out: list[Finding] = []
    total = max(1, f.peak_allocated)
    share = {k: v / total for k, v in f.breakdown.model_dump().items()}
    training = r.mode == "train"

    if f.method != "traced":
        advice = _trace_advice(f.trace_failure or "", f.method)
        out.append(
            Finding(
                # the user's code to change: a warning; the tool's limit or a library's line: for information
                severity="info" if "nothing" in advice.lower() else "warning",
                code="trace_failed_extrapolated",
                message=(
                    f"Tracing on fake tensors failed: {f.trace_failure}. The figures come from real runs on "
                    f"{f.traced_on} ({f.method}). {advice}"
                ),
                skill="debugging-techniques",
            )
        )
    if f.fits is False:
        missing = f.device_bytes - (f.capacity or 0)
        out.append(
            Finding(
                severity="error",
                code="does_not_fit",
                message=(
                    f"The step needs {format_bytes(f.device_bytes)} per device but {format_bytes(f.capacity or 0)} is "
                    f"available ({format_bytes(missing)} short)"
                    + (
                        f"; the largest batch that fits is {f.max_batch_size}."
                        if f.max_batch_size
                        else "; not even batch size 1 fits."
                        if f.max_batch_size == 0
                        else "."
                    )
                    + " Cut the largest category of the breakdown first (see the other findings)."
                ),
                skill="tensor-operations-and-memory",
            )
        )
    if training and share["activations"] >= DOMINANT_SHARE:
        root_saves = f.top_saver is not None and (f.top_saver[0] in ("", "(root)") or not f.top_saver[1])
        target = f.checkpoint_candidate or (f.top_saver[1] if f.top_saver and not root_saves else None)
        if r.checkpoint_classes:
            advice = "they stay large with checkpointing on: checkpoint more, or lower the batch size / sequence length"
        elif f.checkpoint_options:
            advice = _checkpoint_advice(f.checkpoint_options, f.peak_allocated)
        elif target and not root_saves:
            advice = f"wrap {target} in activation checkpointing (activation_checkpointing=['{target}'] to estimate it)"
        else:
            advice = (
                "the model's own forward saves most of them, not a submodule, so there is no block to checkpoint: "
                "move the repeated work into submodule classes and checkpoint those, or lower the batch size / "
                "sequence length"
            )
        out.append(
            Finding(
                severity="warning",
                code="activations_dominate",
                message=(
                    f"Activations saved for backward are {share['activations']:.0%} of the peak "
                    f"({format_bytes(f.breakdown.activations)}); {advice}."
                ),
                skill="tensor-operations-and-memory",
            )
        )
    if training and r.precision == "fp32" and (share["activations"] + share["temporaries"]) >= 0.25:
        out.append(
            Finding(
                severity="info",
                code="fp32_activations",
                message=(
                    "The step runs in fp32: bf16 autocast (precision='bf16_autocast') roughly halves activation and "
                    "temporary memory, and precision='bf16' also halves weights, gradients and optimizer state."
                ),
                skill="mixed-precision-and-optimization",
            )
        )
    state_share = share["optimizer_state"] + share["gradients"]
    if training and share["optimizer_state"] >= 0.25:
        if r.world_size > 1 and r.sharding in ("none", "ddp"):
            out.append(
                Finding(
                    severity="warning",
                    code="shard_optimizer_state",
                    message=(
                        f"Optimizer state is {share['optimizer_state']:.0%} of the peak and every one of the "
                        f"{r.world_size} ranks holds all of it: ZeRO-1/2 or FSDP (sharding='zero1', 'zero2', 'fsdp') "
                        f"divide it by {r.world_size}."
                    ),
                    skill="distributed-training-strategies",
                )
            )
        else:
            out.append(
                Finding(
                    severity="info",
                    code="optimizer_state_large",
                    message=(
                        f"Optimizer state and gradients are {state_share:.0%} of the peak: "
                        + (
                            "a fused optimizer (fused=True) avoids foreach temporaries, "
                            if r.target_device == "cuda"
                            else ""
                        )
                        + "an 8-bit optimizer shrinks Adam's state 4x, "
                        "and SGD with momentum keeps one state tensor instead of two."
                    ),
                    skill="mixed-precision-and-optimization",
                )
            )
    # foreach is CUDA's default implementation; a CPU step updates parameter by parameter, so the
    # advice (and the cause it names) only holds for a CUDA target.
    cuda_target = r.target_device == "cuda"
    if (
        cuda_target
        and f.phase == "optimizer_step"
        and share["temporaries"] >= SPIKE_SHARE
        and r.optimizer != "none"
    ):
        out.append(
            Finding(
                severity="info",
                code="optimizer_step_spike",
                message=(
                    f"The peak is in optimizer.step(), where {format_bytes(f.breakdown.temporaries)} of temporaries "
                    "are alive: the foreach implementation (CUDA's default) builds whole-model intermediate lists. "
                    "fused=True (AdamW/Adam/SGD on CUDA) updates in place without them."
                ),
                skill="mixed-precision-and-optimization",
            )
        )
    if r.target_device == "cuda" and f.peak_reserved > f.peak_allocated * (1 + FRAGMENTATION_SHARE):
        out.append(
            Finding(
                severity="info",
                code="allocator_fragmentation",
                message=(
                    f"The caching allocator would reserve {format_bytes(f.peak_reserved - f.peak_allocated)} more than "
                    "is allocated at the peak (freed blocks that later requests do not fit). "
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True usually recovers most of it."
                ),
                skill="tensor-operations-and-memory",
            )
        )
    if training and r.gradient_accumulation > 1:
        out.append(
            Finding(
                severity="info",
                code="gradient_accumulation",
                message=(
                    f"gradient_accumulation={r.gradient_accumulation} does not grow with the number of micro-batches, "
                    f"but from the second micro-batch on the gradients stay alive through the forward pass: "
                    f"+{format_bytes(f.grad_accum_extra)} at the peak compared with one micro-batch."
                ),
                skill="tensor-operations-and-memory",
            )
        )
    if r.target_device == "cuda" and not f.traced_on.startswith("cuda"):
        out.append(
            Finding(
                severity="info",
                code="traced_without_gpu",
                message=(
                    "No GPU here, so the step was traced with the CPU's kernels: CUDA-only choices (autocast's op "
                    "lists, SDPA back-ends, cuDNN workspaces) are not reproduced, while the CUDA allocator's "
                    "rounding and cache, cuBLAS workspaces and the foreach optimizer are modelled. Where a GPU is "
                    "present the tool traces with CUDA's kernels."
                ),
                skill="tensor-operations-and-memory",
            )
        )
    if f.kernels_not_probed:
        out.append(
            Finding(
                severity="info",
                code="kernel_scratch_not_measured",
                message=(
                    f"{f.kernels_not_probed} convolution/RNN/attention kernels were not run for real (over the probes' size "
                    "or time budget, or they fail on zeros), so their scratch memory is missing from the estimate."
                ),
                skill="tensor-operations-and-memory",
            )
        )
    return out


def memory_summary(f: Facts) -> str:
    r = f.request
    where = f"{f.phase}" + (f" in {f.module}" if f.module else "")
    per_rank = (
        f" per rank ({r.sharding}, {r.world_size} ranks)" if r.world_size > 1 and r.sharding != "none" else ""
    )
    text = f"Peak {format_bytes(f.peak_allocated)} allocated{per_rank}"
    if r.target_device == "cuda":
        text += f", {format_bytes(f.device_bytes)} on the device with the allocator's cache and CUDA context"
    text += f", during {where} ({f.method})."
    if f.fits is not None:
        verdict = "fits in" if f.fits else "does NOT fit in"
        text += f" It {verdict} {format_bytes(f.capacity or 0)}"
        if f.max_batch_size == 0:
            text += "; not even batch size 1 fits."
        elif f.max_batch_size is not None:
            text += f"; max batch size {f.max_batch_size}."
        else:
            text += "."
    largest = max(f.breakdown.model_dump().items(), key=lambda kv: kv[1])
    text += f" Largest share: {largest[0]} ({format_bytes(largest[1])})."
    return text

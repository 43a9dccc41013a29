"""From a trace to the figures a user asks for: peak allocated, reserved, on-device, and where.

Use:

    target = Target(cuda=True, capacity_bytes=24 * 2**30, sharding="fsdp", world_size=8)
    est = estimate_trace(trace, target)
    est.peak_allocated, est.peak_reserved, est.device_bytes, est.breakdown, est.fits

For a CUDA target the trace is replayed through the caching-allocator model with the cuBLAS
workspaces added (`torch_skills.memory.overheads`) and the CUDA context added on top of reserved
memory; for a CPU target the figures are exact storage bytes and reserved equals allocated.
`extrapolate(a, b, batch_size)` combines two estimates at small batch sizes linearly.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from torch_skills.memory.ledger import ALLOC, StorageRecord
from torch_skills.memory.overheads import (
    CUBLASLT_WORKSPACE,
    cublas_workspace_bytes,
    cublaslt_threads,
    cuda_context_bytes,
    uses_cublas,
)
from torch_skills.memory.sharding import ShardPlan, apply_plan, shard_plan
from torch_skills.memory.timeline import CATEGORIES, replay_events
from torch_skills.memory.trace import Trace


@dataclass(frozen=True)
class Target:
    """The device and the parallel layout the estimate is for."""

    cuda: bool = True
    capacity_bytes: int | None = None  # device memory, when known
    sharding: str = "none"
    world_size: int = 1
    hopper: bool = False  # sm90 GPUs get a 32 MiB cuBLAS workspace
    training: bool = True


@dataclass
class Estimate:
    batch_size: int | None
    peak_allocated: int
    peak_reserved: int
    context_bytes: int
    peak_tensor_bytes: int
    breakdown: dict[str, int]
    phase: str
    module: str
    op: str
    phase_peaks: dict[str, int]
    saved_by_module: dict[str, int]
    activation_bytes: int
    workspace_bytes: int
    fits: bool | None
    scratch_bytes: int = 0  # of peak_allocated, kernel scratch measured by probes (not tensor storage)
    assumptions: list[str] = field(default_factory=list)

    @property
    def device_bytes(self) -> int:
        """What the device must have free: reserved memory plus the CUDA context."""
        return self.peak_reserved + self.context_bytes


def plan_for(trace: Trace, target: Target) -> ShardPlan:
    return shard_plan(
        target.sharding if target.world_size > 1 else "none",
        target.world_size,
        trainable_param_bytes=trace.trainable_param_bytes,
        units=trace.fsdp_units,
        training=target.training,
    )


def estimate_trace(trace: Trace, target: Target) -> Estimate:
    """Replay `trace` for `target`; see the module docstring."""
    plan = plan_for(trace, target)
    events = apply_plan(trace.events, plan)
    workspace = 0
    context = 0
    assumptions = list(plan.assumptions)
    if target.cuda:
        context = cuda_context_bytes()
        blocks = []
        if uses_cublas(trace.events):
            handles = 2 if target.training else 1
            blocks += [
                (cublas_workspace_bytes(hopper=target.hopper, handles=1), "cuBLAS workspace")
            ] * handles
        blocks += [(CUBLASLT_WORKSPACE, "cuBLASLt workspace")] * cublaslt_threads(trace.events)
        workspace = sum(nbytes for nbytes, _ in blocks)
        events = [
            (ALLOC, StorageRecord(-10_000 - i, nbytes, "buffer", "setup", name))
            for i, (nbytes, name) in enumerate(blocks)
        ] + events
    capacity = None
    if target.capacity_bytes is not None and target.cuda:
        capacity = max(0, target.capacity_bytes - context)
    replay = replay_events(events, cuda=target.cuda, capacity_bytes=capacity)
    reserved = replay.peak_reserved if replay.peak_reserved is not None else replay.peak.total
    if target.capacity_bytes is None:
        fits = None
    elif target.cuda:
        fits = not replay.oom and replay.peak.total + context <= target.capacity_bytes
    else:
        fits = replay.peak.total <= target.capacity_bytes
    return Estimate(
        batch_size=trace.batch_size,
        peak_allocated=replay.peak.total,
        peak_reserved=reserved,
        context_bytes=context,
        peak_tensor_bytes=replay.peak_tensor_bytes,
        breakdown={k: replay.peak.by_category.get(k, 0) for k in CATEGORIES},
        phase=replay.peak.phase,
        module=replay.peak.module,
        op=replay.peak.op,
        phase_peaks=replay.phase_peaks,
        saved_by_module=replay.saved_by_module,
        activation_bytes=replay.activation_bytes,
        workspace_bytes=workspace,
        fits=fits,
        scratch_bytes=replay.peak.scratch,
        assumptions=assumptions,
    )


def extrapolate(small: Estimate, large: Estimate, batch_size: int, capacity_bytes: int | None) -> Estimate:
    """Linear extrapolation of every byte figure from two batch sizes to `batch_size`."""
    b0, b1 = small.batch_size or 1, large.batch_size or 2
    t = (batch_size - b0) / (b1 - b0) if b1 != b0 else 0.0

    def line(a: int, b: int) -> int:
        return max(0, round(a + (b - a) * t))

    breakdown = {k: line(small.breakdown.get(k, 0), large.breakdown.get(k, 0)) for k in CATEGORIES}
    est = replace(
        large,
        batch_size=batch_size,
        peak_allocated=line(small.peak_allocated, large.peak_allocated),
        peak_reserved=line(small.peak_reserved, large.peak_reserved),
        peak_tensor_bytes=line(small.peak_tensor_bytes, large.peak_tensor_bytes),
        breakdown=breakdown,
        phase_peaks={k: line(small.phase_peaks.get(k, 0), v) for k, v in large.phase_peaks.items()},
        saved_by_module={
            k: line(small.saved_by_module.get(k, 0), v) for k, v in large.saved_by_module.items()
        },
        activation_bytes=line(small.activation_bytes, large.activation_bytes),
        scratch_bytes=line(small.scratch_bytes, large.scratch_bytes),
    )
    if capacity_bytes is not None:
        est.fits = est.device_bytes <= capacity_bytes
    return est

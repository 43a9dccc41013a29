"""Per-rank memory under data parallelism, as a rewrite of a single-device trace.

Use:

    plan = shard_plan("fsdp", world_size=8, trace=trace)
    events = apply_plan(trace.events, plan)     # then replay_events(events, ...) as usual
    plan.assumptions                            # what the figures take for granted, in words

The trace is of one device holding everything. A plan scales the storages of some kinds down to
one rank's share and adds the buffers the strategy itself allocates:

- ddp: every rank holds a full replica; DDP's reducer adds gradient buckets as large as all
  gradients together (`gradient_as_bucket_view=False`, the default), allocated at construction,
  in buckets of 25 MiB (`bucket_cap_mb`) after a first bucket of 1 MiB.
- zero1: optimizer state / world_size (ZeroRedundancyOptimizer, DeepSpeed stage 1).
- zero2: optimizer state and gradients / world_size; while a unit's backward runs, its full
  gradients exist until they are reduce-scattered (FSDP SHARD_GRAD_OP, DeepSpeed stage 2).
- fsdp: parameters, gradients and optimizer state / world_size (FULL_SHARD, ZeRO-3); during
  forward and backward the root unit's parameters and those of two of the largest units (the one
  running and the one prefetched) are gathered, and in backward one unit's full gradients exist.

Units are `Trace.fsdp_units`: the outermost repeated blocks (or the activation_checkpointing
classes), see `torch_skills.memory.trace.fsdp_units`.

Known limitations: communication buffers of NCCL itself, bucket reuse across iterations, and
parameters that FSDP keeps unsharded for other reasons (ignored modules, non-wrapped tied
weights) are not modelled; sharded sizes are rounded up per storage, not per flat parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch_skills.memory.ledger import ALLOC, FREE, PHASE, StorageRecord

DDP_BUCKET_CAP_BYTES = 25 * 2**20  # DistributedDataParallel(bucket_cap_mb=25) default
DDP_FIRST_BUCKET_BYTES = 1 * 2**20  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES


@dataclass
class ShardPlan:
    sharding: str
    world_size: int
    scale: dict[str, int] = field(default_factory=dict)  # storage kind -> divide its bytes by this
    persistent: list[tuple[str, int, str]] = field(
        default_factory=list
    )  # (kind, bytes, label), alive all step
    forward_transient: list[tuple[str, int, str]] = field(default_factory=list)  # alive during forward phases
    backward_transient: list[tuple[str, int, str]] = field(
        default_factory=list
    )  # alive during backward phases
    assumptions: list[str] = field(default_factory=list)

    @property
    def changes_anything(self) -> bool:
        return bool(self.scale or self.persistent or self.forward_transient or self.backward_transient)


def shard_plan(
    sharding: str, world_size: int, *, trainable_param_bytes: int, units: dict[str, int], training: bool
) -> ShardPlan:
    """The plan for one strategy; `units` maps FSDP unit names to their parameter bytes."""
    plan = ShardPlan(sharding, world_size)
    if sharding == "none" or world_size < 1:
        return plan
    blocks = {name: size for name, size in units.items() if name != "(root)"}
    root = units.get("(root)", 0)
    largest = max(blocks.values(), default=0)
    second = sorted(blocks.values(), reverse=True)[1] if len(blocks) > 1 else 0
    w = world_size

    if sharding == "ddp":
        if training and trainable_param_bytes:
            for i, size in enumerate(_buckets(trainable_param_bytes)):
                plan.persistent.append(("gradient", size, f"DDP gradient bucket {i}"))
            plan.assumptions.append(
                f"ddp: full replica per rank plus gradient buckets as large as all gradients "
                f"({trainable_param_bytes} B, 25 MiB buckets); DistributedDataParallel(gradient_as_bucket_view=True) removes them"
            )
        else:
            plan.assumptions.append("ddp: full replica per rank; inference needs no gradient buckets")
        return plan

    if sharding in ("zero1", "zero2", "fsdp") and training:
        plan.scale["optimizer_state"] = w
    if sharding in ("zero2", "fsdp") and training:
        plan.scale["gradient"] = w
        if largest:
            plan.backward_transient.append(
                ("gradient", largest, "full gradients of the unit being reduce-scattered")
            )
    if sharding == "fsdp":
        plan.scale["parameter"] = w
        gathered = root + largest + second
        if gathered:
            plan.forward_transient.append(
                ("parameter", gathered, "gathered parameters (root unit + running + prefetched unit)")
            )
            if training:
                plan.backward_transient.append(
                    ("parameter", gathered, "gathered parameters (root unit + running + prefetched unit)")
                )
        plan.assumptions.append(
            f"fsdp: parameters, gradients and optimizer state / {w}; during forward and backward the root unit "
            f"({root} B) and the two largest of {len(blocks)} units ({largest} B + {second} B) are gathered"
        )
    elif sharding == "zero2":
        plan.assumptions.append(
            f"zero2: gradients and optimizer state / {w}, parameters replicated; one unit's full gradients "
            f"({largest} B) exist until reduce-scattered"
        )
    elif sharding == "zero1":
        plan.assumptions.append(f"zero1: optimizer state / {w}; parameters and gradients replicated")
    if not training and sharding in ("zero1", "zero2"):
        plan.assumptions.append(f"{sharding} shards training state only: inference memory is a full replica")
    return plan


def apply_plan(events: list, plan: ShardPlan) -> list:
    """A copy of `events` with one rank's storage sizes and the strategy's own buffers."""
    if not plan.changes_anything:
        return events
    copies: dict[StorageRecord, StorageRecord] = {}
    next_rid = -1

    def synthetic(kind: str, nbytes: int, label: str) -> StorageRecord:
        nonlocal next_rid
        next_rid -= 1
        return StorageRecord(next_rid, nbytes, kind, "setup", label)

    out: list = [(ALLOC, synthetic(kind, size, label)) for kind, size, label in plan.persistent]
    open_transients: list[StorageRecord] = []
    for tag, value in events:
        if tag in (ALLOC, FREE):
            rec = copies.get(value)
            if rec is None:
                divisor = plan.scale.get(value.kind, 1)
                rec = StorageRecord(
                    value.rid,
                    math.ceil(value.nbytes / divisor),
                    value.kind,
                    value.phase,
                    value.module,
                    value.saved_by,
                )
                copies[value] = rec
            out.append((tag, rec))
            continue
        if tag == PHASE:
            for rec in open_transients:
                out.append((FREE, rec))
            open_transients = []
            out.append((tag, value))
            wanted = (
                plan.forward_transient
                if value == "forward"
                else plan.backward_transient
                if value == "backward"
                else []
            )
            for kind, size, label in wanted:
                rec = synthetic(kind, size, label)
                open_transients.append(rec)
                out.append((ALLOC, rec))
            continue
        out.append((tag, value))
    return out


def _buckets(total: int) -> list[int]:
    sizes, left = [], total
    first = min(left, DDP_FIRST_BUCKET_BYTES)
    sizes.append(first)
    left -= first
    while left > 0:
        sizes.append(min(left, DDP_BUCKET_CAP_BYTES))
        left -= sizes[-1]
    return sizes

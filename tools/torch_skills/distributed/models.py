"""Request and result schemas of check_distributed (no torch here: the server imports this module).

Use `DistributedRequest(model="net.py:build", input_shape=[8, 16], world_size=2)`; the worker
(`torch_skills.distributed.worker:run`) returns a `DistributedResult`. `FINDING_KINDS` lists the
kinds of finding and what each means.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from torch_skills.results import BatchRule, Finding, RunInfo
from torch_skills.userspec import ModelInputs

Kind = Literal[
    "unused_parameters",
    "collective_mismatch",
    "replica_divergence",
    "gradient_scale",
    "data_sharding",
    "rank_failure",
]

FINDING_KINDS: dict[str, str] = {
    "unused_parameters": "parameters that got no gradient on some rank: always unused (remove or freeze "
    "them) or data-dependent (find_unused_parameters=True, at its cost)",
    "collective_mismatch": "ranks called different collectives (op, shape or dtype) or one rank called "
    "one alone: the first divergence per rank, with its call site",
    "replica_divergence": "parameters or buffers whose values differ across ranks after a step",
    "gradient_scale": "the averaged gradient differs from one process on the same global batch "
    "(a uniform factor of world_size: a summed loss)",
    "data_sharding": "the data= loader gives ranks the same samples, repeats its order across epochs, "
    "or gives ranks different numbers of batches",
    "rank_failure": "a rank crashed, hung or exited early; the call ended and every rank was stopped",
}


class DistributedRequest(ModelInputs):
    """The model contract plus how many ranks, which wrapper, and how many steps."""

    data: str | None = Field(
        default=None,
        description="'file.py:make_loader' called in every rank (with rank=, world_size= if it "
        "takes them) returning its loader; replaces inputs/input_shape",
    )
    world_size: int = Field(default=2, ge=2, le=8, description="ranks to start")
    steps: int = Field(default=3, ge=1, le=50, description="training steps each rank runs")
    strategy: Literal["ddp", "fsdp"] = Field(
        default="ddp", description="ddp: DistributedDataParallel; fsdp: FSDP2 fully_shard"
    )
    hang_timeout_s: float = Field(
        default=30.0, ge=2, le=600, description="a rank waiting this long in a collective is a hang"
    )
    seed: int = Field(default=0, description="torch.manual_seed in every rank before the build")

    @model_validator(mode="after")
    def _needs_some_input(self) -> DistributedRequest:
        if self.inputs is None and self.input_shape is None and self.data is None:
            raise ValueError(
                "give data ('file.py:make_loader'), inputs ('file.py:make_inputs') or input_shape "
                "(e.g. [8, 16], the global batch: each rank gets input_shape[0] / world_size rows)"
            )
        return self


# ------------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------------
class RankCall(BaseModel):
    """One rank's collective at the first divergence (or the one it was blocked in)."""

    rank: int
    seq: int | None = None
    op: str | None = Field(default=None, description="None: the rank made no call there")
    shapes: list[list[int]] = Field(default_factory=list)
    dtype: str | None = None
    where: str | None = Field(default=None, description="file:line, or the DDP bucket")


class DistributedFinding(Finding):
    """A finding with what it concerns and the fix."""

    kind: Kind
    names: list[str] = Field(default_factory=list, description="parameters/buffers concerned")
    ranks: list[int] = Field(default_factory=list)
    where: list[str] = Field(default_factory=list, description="file:line in the user's code")
    fix: str
    calls: list[RankCall] = Field(default_factory=list, description="collective_mismatch: per rank")
    measured: dict[str, float] = Field(default_factory=dict)


class CollectiveCount(BaseModel):
    count: int = 0
    bytes: int = 0


class StepStats(BaseModel):
    """One rank's step: collectives by kind (all_reduce, all_gather, reduce_scatter, broadcast...)."""

    step: int
    loss: float | None = None
    seconds: float
    collectives: dict[str, CollectiveCount] = Field(default_factory=dict)


class RankReport(BaseModel):
    rank: int
    outcome: Literal["ok", "error", "crashed", "hung", "exited_early"]
    phase: str = Field(description="last phase, e.g. 'step 2 backward'")
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None
    steps: list[StepStats] = Field(default_factory=list)
    peak_memory_bytes: int | None = Field(
        default=None, description="cuda: max_memory_allocated; cpu: peak RSS added after the fork"
    )


class Bucket(BaseModel):
    index: int
    bytes: int
    parameters: int
    names: list[str] = Field(description="first parameter names")


class GradientCheck(BaseModel):
    """The DDP/FSDP gradient of one step against one process on the same global batch."""

    parameters_compared: int
    ratio_median: float | None = Field(description="median |one process| / |distributed| gradient norm")
    ratio_min: float | None = None
    ratio_max: float | None = None
    max_relative_difference: float
    note: str


class DataReport(BaseModel):
    """What the data= loaders gave the ranks."""

    loader: str
    sampler: str | None = None
    batches_per_rank: list[int | None]
    overlap: float | None = Field(default=None, description="largest share of a rank's rows another rank got")
    order_repeats_across_epochs: bool | None = None
    measured_on: str


class MemoryReport(BaseModel):
    per_rank_peak_bytes: list[int | None]
    estimate_bytes: int | None = Field(default=None, description="estimate_memory's per-rank peak")
    note: str


class DistributedResult(BaseModel):
    target: str
    strategy: Literal["ddp", "fsdp"]
    world_size: int
    backend: str
    steps_requested: int
    steps_completed: int
    findings: list[DistributedFinding]
    ranks: list[RankReport]
    ddp_buckets: list[Bucket] | None = None
    gradient_check: GradientCheck | None = None
    data: DataReport | None = None
    memory: MemoryReport | None = None
    batch_rule: BatchRule | None = None
    notes: list[str] = Field(default_factory=list, description="explained, not flagged (e.g. BatchNorm)")
    summary: str
    run: RunInfo | None = None

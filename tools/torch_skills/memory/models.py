"""Request and result of estimate_memory, as pydantic models (no torch: the server imports this).

Use `EstimateMemoryRequest(model="net.py:build", input_shape=[8, 3, 224, 224], precision="bf16_autocast",
device_memory_gib=24)`; the worker (`torch_skills.memory.worker.run`) returns an `EstimateMemoryResult`.
Every byte figure is an int in bytes; `summary` repeats the headline in words.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from torch_skills.results import BatchRule, Finding, RunInfo
from torch_skills.userspec import Mode, ModelInputs, Precision

OptimizerName = Literal["adamw", "adam", "sgd", "sgd_momentum", "none"]
Sharding = Literal["none", "ddp", "zero1", "zero2", "fsdp"]
TargetDevice = Literal["cuda", "cpu"]
Phase = Literal["forward", "backward", "optimizer_step", "setup", "end"]
Method = Literal["traced", "extrapolated", "measured"]


class EstimateMemoryRequest(ModelInputs):
    """What to estimate: the model and batch (ModelInputs) plus how it is trained or served."""

    mode: Mode = Field(
        default="train",
        description="train: forward, backward and optimizer step; inference: forward under no_grad",
    )
    optimizer: OptimizerName = Field(
        default="adamw", description="optimizer whose state is counted (train only)"
    )
    precision: Precision = Field(
        default="fp32",
        description="fp32; bf16/fp16: the model is cast (optimizer state follows); *_autocast: fp32 weights, autocast forward",
    )
    activation_checkpointing: list[str] | Literal["off"] = Field(
        default="off",
        description="'off', or module class names whose forward is recomputed in backward, e.g. ['Block']",
    )
    batch_size: int | None = Field(
        default=None,
        ge=1,
        le=1 << 20,
        description="batch size to estimate; default: input_shape[0] or the batch inputs returns",
    )
    gradient_accumulation: int = Field(
        default=1, ge=1, le=4096, description="micro-batches per optimizer step"
    )
    world_size: int = Field(
        default=1, ge=1, le=65536, description="data-parallel ranks; figures are per rank"
    )
    sharding: Sharding = Field(
        default="none", description="how state is split across ranks: none, ddp, zero1, zero2, fsdp"
    )
    device_memory_gib: float | None = Field(
        default=None,
        gt=0,
        le=4096,
        description="memory of one device in GiB: enables `fits` and the max_batch_size search",
    )
    target_device: TargetDevice = Field(
        default="cuda",
        description="cuda: apply the CUDA caching allocator, cuBLAS workspaces and context; cpu: exact tensor bytes",
    )

    @field_validator("activation_checkpointing")
    @classmethod
    def _class_names(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list):
            if not value:
                return "off"
            bad = [v for v in value if not v.isidentifier()]
            if bad:
                raise ValueError(
                    f"activation_checkpointing takes module class names such as 'Block'; not {bad}"
                )
        return value

    @property
    def checkpoint_classes(self) -> tuple[str, ...]:
        return () if self.activation_checkpointing == "off" else tuple(self.activation_checkpointing)


class MemoryBreakdown(BaseModel):
    """Bytes held at the peak, by what they are."""

    parameters: int = Field(description="parameters (per rank, sharded when sharding shards them)")
    gradients: int = Field(description="parameter gradients (.grad), DDP buckets, unsharded unit gradients")
    optimizer_state: int = Field(description="optimizer state, e.g. Adam's two moments")
    activations: int = Field(
        description="tensors saved for backward (incl. autocast's low-precision weight copies)"
    )
    temporaries: int = Field(
        description="everything else alive: op outputs in flight, gradients of activations, kernel scratch"
    )
    other: int = Field(description="inputs, buffers (e.g. BatchNorm statistics), cuBLAS workspaces")


class ActivationSaver(BaseModel):
    module: str = Field(description="qualified module name, e.g. 'layers.3.attention'")
    type: str = Field(description="module class")
    saved_bytes: int = Field(description="bytes it saved for backward in one forward pass")


class CheckpointOption(BaseModel):
    block_class: str
    peak_allocated_bytes: int = Field(description="the peak with block_class checkpointed")


class TracedBatch(BaseModel):
    batch_size: int
    device_bytes: int = Field(description="reserved + context bytes needed at this batch size")


class EstimateMemoryResult(BaseModel):
    run: RunInfo | None = None
    batch_rule: BatchRule | None = Field(
        default=None, description="how the batch was fed and where the loss came from"
    )
    method: Method = Field(
        description="traced: one fake step; extrapolated: real runs at small batches, linear; measured: one real run"
    )
    method_detail: str
    target_device: TargetDevice
    traced_on: str = Field(description="device whose kernels the trace followed, e.g. 'cpu'")
    mode: Mode
    precision: Precision
    optimizer: OptimizerName
    batch_size: int | None = Field(description="batch size the figures are for")
    world_size: int
    sharding: Sharding

    peak_allocated_bytes: int = Field(
        description="peak of memory_allocated(): tensor blocks (CUDA) or tensor bytes (CPU), per rank"
    )
    peak_reserved_bytes: int = Field(
        description="peak of memory_reserved() the CUDA allocator would hold (= allocated on CPU)"
    )
    cuda_context_bytes: int = Field(
        description="stated CUDA context overhead, outside the allocator (0 on CPU)"
    )
    peak_device_bytes: int = Field(description="reserved + context: what the device must have for the step")
    peak_tensor_bytes: int = Field(
        description="peak of exact storage bytes, without allocator rounding or workspaces"
    )
    breakdown: MemoryBreakdown
    peak_phase: Phase
    peak_module: str = Field(
        description="innermost module running at the peak ('' when outside any module, e.g. the optimizer)"
    )
    peak_op: str = Field(description="aten op after which the peak was reached")
    phase_peaks: dict[str, int] = Field(description="peak allocated bytes within each phase")
    activation_bytes: int = Field(
        description="bytes saved for backward at the end of the (first) forward pass"
    )
    top_activation_modules: list[ActivationSaver]
    single_device_peak_allocated_bytes: int | None = Field(
        default=None, description="the same step on one device, when the figures above are per-rank shares"
    )

    parameter_count: int
    trainable_parameter_count: int
    parameter_bytes: int
    cublas_workspace_bytes: int = Field(
        description="cuBLAS workspaces counted in allocated memory (CUDA target)"
    )
    checkpointing_options: list[CheckpointOption] = Field(
        default_factory=list, description="block classes to checkpoint, each estimated; lowest peak first"
    )
    kernel_scratch_bytes: int = Field(
        default=0, description="kernel scratch (conv/RNN/cuDNN workspaces) in the peak, within temporaries"
    )

    device_memory_bytes: int | None = None
    fits: bool | None = Field(
        default=None, description="whether the step fits device_memory_gib (None when not given)"
    )
    headroom_bytes: int | None = Field(
        default=None, description="device memory left at the peak (negative: missing)"
    )
    max_batch_size: int | None = Field(
        default=None, description="largest batch size that fits, found by search"
    )
    max_batch_size_method: str | None = None
    batch_sizes_traced: list[TracedBatch] = Field(default_factory=list)

    gradient_accumulation: int
    assumptions: list[str] = Field(description="what the figures take for granted")
    findings: list[Finding]
    summary: str

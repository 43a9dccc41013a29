"""Request and result schemas of `profile_model` (pydantic only: the server imports this, never torch).

Use `ProfileRequest(model="net.py:build", input_shape=[32, 64], mode="train")`, send it to
`torch_skills.profiling.worker:run`, and read the answer as `ProfileResult.model_validate(data)`.
Every figure is in raw units (seconds, FLOPs, bytes) and per training/inference step.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from torch_skills.results import BatchRule, Finding, RunInfo
from torch_skills.userspec import Mode, ModelInputs, Precision

Optimizer = Literal["adamw", "sgd"]
BatchInput = Literal["auto", "whole", "first"]
Bottleneck = Literal["data_loading", "cpu_overhead", "compute", "memory_bandwidth", "unknown"]
OpCategory = Literal[
    "matmul", "convolution", "attention", "elementwise", "normalization", "reduction",
    "memory_copy", "host_sync", "optimizer", "autograd", "other",
]  # fmt: skip
Phase = Literal["data", "forward", "loss", "backward", "optimizer"]


class ProfileRequest(ModelInputs):
    """What to profile: the model contract plus how to run the step and how long to measure."""

    data: str | None = Field(
        default=None,
        description="'file.py:make_loader' returning an iterable of batches (e.g. a DataLoader); "
        "replaces inputs/input_shape; the wait for data is measured",
    )
    batch_input: BatchInput = Field(
        default="auto",
        description="'auto': every tool's rule (tensor -> model(x), dict -> model(**x), tuple -> "
        "model(*x), or model(*x[:-1]) and x[-1] the target when forward takes one argument fewer); "
        "'whole': model(*x); 'first': model(batch[0]). The loss gets the whole batch.",
    )
    mode: Mode = Field(
        default="train",
        description="'train': forward, loss, backward, optimizer step; 'inference': forward only",
    )
    optimizer: Optimizer = Field(default="adamw", description="optimizer used in train mode")
    precision: Precision = Field(
        default="fp32",
        description="fp32; bf16/fp16: model and float inputs cast; "
        "*_autocast: torch.autocast around forward and loss (fp16 with a GradScaler)",
    )
    warmup_steps: int = Field(
        default=3, ge=1, le=100, description="steps run before timing starts; long steps use fewer (>=2)"
    )
    active_steps: int = Field(
        default=10,
        ge=3,
        le=200,
        description="steps timed and profiled; long steps use fewer (>=3 timed, >=2 profiled)",
    )
    compile: bool = Field(
        default=False,
        description="also time torch.compile(model): compile time and speed-up over eager",
    )
    trace_path: str | None = Field(
        default=None,
        description="write a Chrome/Perfetto trace of the profiled steps to this .json path "
        "(under an allowed root; open in ui.perfetto.dev)",
    )
    top_k: int = Field(default=15, ge=1, le=100, description="how many operators to list in top_ops")

    @field_validator("trace_path")
    @classmethod
    def _trace_is_json(cls, value: str | None) -> str | None:
        if value is not None and not value.endswith(".json"):
            raise ValueError(
                f"trace_path {value!r} must end in .json (a Chrome trace), e.g. 'traces/step.json'"
            )
        return value

    @model_validator(mode="after")
    def _needs_some_input(self) -> ProfileRequest:
        if self.inputs is None and self.input_shape is None and self.data is None:
            raise ValueError(
                "give data ('file.py:make_loader'), inputs ('file.py:make_inputs') or input_shape (e.g. [8, 3, 32, 32])"
            )
        return self

    def named_paths(self) -> list[str]:
        """Every file path the request names (code files and the trace), for the allowed-roots check."""
        paths = super().named_paths()
        if self.trace_path is not None:
            paths.append(self.trace_path)
        return paths


class StepTiming(BaseModel):
    """Wall-clock step times without the profiler (CUDA synchronized around each step)."""

    median_s: float
    iqr_s: float = Field(description="interquartile range of the step times")
    min_s: float
    max_s: float
    times_s: list[float] = Field(description="every timed step, in order")
    noisy: bool = Field(description="IQR above 10% of the median: compare figures with care")


class OpTime(BaseModel):
    """One operator's self time per step (time in the op itself, not in the ops it calls)."""

    name: str = Field(description="profiler name, e.g. 'aten::addmm'")
    category: OpCategory
    calls_per_step: float
    self_time_s: float = Field(
        description="per step, on the device that bounds it: CUDA time on a GPU, else CPU"
    )
    self_cpu_time_s: float
    self_device_time_s: float | None = Field(default=None, description="CUDA kernel time, when on a GPU")
    share: float = Field(description="fraction of all operators' self time")


class CategoryTime(BaseModel):
    category: OpCategory
    self_time_s: float
    share: float


class PhaseTime(BaseModel):
    """Time per phase of the step (inclusive host time; device time of the kernels it launched on a GPU)."""

    phase: Phase
    cpu_time_s: float
    device_time_s: float | None = None
    share: float = Field(description="fraction of the profiled step's host time")


class ModuleTime(BaseModel):
    """A top-level submodule's forward pass (ModuleList/ModuleDict opened one level): time, share, FLOPs."""

    name: str
    type: str
    forward_time_s: float = Field(description="host time per step in its forward (inclusive)")
    forward_device_time_s: float | None = None
    share_of_forward: float
    flops_per_step: int = Field(description="FLOPs of its forward and backward (FlopCounterMode)")


class HostSync(BaseModel):
    """A place in the step that reads a tensor's value on the host (a device sync on a GPU)."""

    op: str = Field(description="e.g. 'Tensor.item', 'Tensor.tolist', 'aten::nonzero'")
    calls_per_step: int
    phase: Phase | None = None
    module: str | None = Field(default=None, description="innermost module it ran in, e.g. 'blocks.3'")
    location: str | None = Field(default=None, description="'file.py:line' in your code")


class CompileReport(BaseModel):
    """torch.compile(model) against eager."""

    status: Literal["ok", "failed"]
    compile_time_s: float | None = Field(
        default=None, description="first compiled step: compilation plus one step"
    )
    step_time_s: float | None = Field(default=None, description="median compiled step time")
    step_time_iqr_s: float | None = None
    speedup: float | None = Field(default=None, description="eager median / compiled median")
    graph_breaks: int | None = None
    graph_break_reasons: list[str] = Field(default_factory=list)
    error: str | None = None


class BottleneckShares(BaseModel):
    """Shares of the step time: data_wait + work + host_overhead = 1; compute and memory split `work`."""

    data_wait: float | None = Field(default=None, description="measured wait on next(loader) / step time")
    work: float = Field(
        description="GPU: kernel time / step time; CPU: self time of ops longer than the small-op threshold "
        "(20x the tiny-op dispatch cost) / step time"
    )
    host_overhead: float = Field(
        description="the rest: 1 - work - data_wait (Python, dispatch, launches, syncs)"
    )
    compute: float = Field(description="roofline estimate: FLOPs / attainable FLOP/s / fastest step time")
    memory_bandwidth: float = Field(
        description="roofline estimate: bytes moved / attainable bytes/s / fastest step time"
    )


class Evidence(BaseModel):
    metric: str
    value: float
    meaning: str


class LoaderInfo(BaseModel):
    """The user's loader as configured (read from a torch DataLoader's attributes; None where unknown)."""

    type: str = Field(description="class of the iterable data= returned, e.g. 'DataLoader'")
    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None


class ProfileResult(BaseModel):
    """Where a step's time goes, what bounds it, and which skill fixes it."""

    run: RunInfo | None = None
    batch_rule: BatchRule | None = Field(
        default=None, description="how the batch was fed and where the loss came from"
    )
    loader: LoaderInfo | None = Field(
        default=None, description="the data= loader's settings, when data is given"
    )
    device: str = Field(description="'cpu' or 'cuda:N'")
    device_name: str = Field(description="e.g. 'cpu: AMD EPYC (2 threads)' or 'NVIDIA H100 80GB HBM3'")
    cpu_threads: int = Field(
        default=1,
        description="torch intra-op threads the measured steps ran with (cpu_threads, or the default rule's count)",
    )
    cpu_load: float | None = Field(
        default=None,
        description="highest 1-minute load average seen during the run, per CPU core (above 1: oversubscribed)",
    )
    mode: Mode
    precision: Precision
    samples_per_step: int | None = Field(default=None, description="leading size of the batch's first tensor")

    step_time_s: float = Field(description="median step time without the profiler")
    step_time_iqr_s: float
    timing: StepTiming
    throughput_samples_per_s: float | None = None
    profiled_step_time_s: float = Field(description="median step time under torch.profiler")
    profiler_overhead_ratio: float = Field(description="profiled / unprofiled median step time")

    data_wait_s: float | None = Field(default=None, description="median time per step in next(loader)")
    data_wait_share: float | None = None

    flops_per_step: int = Field(
        description="FlopCounterMode count: matmul, conv, attention, fused RNN layers, grouped "
        "matmuls (MoE experts); elementwise ops count 0"
    )
    achieved_flops_per_s: float
    attainable_flops_per_s: float = Field(
        description="a large matmul in the step's dtype, measured in this run"
    )
    peak_flops_per_s: float | None = Field(
        default=None, description="datasheet dense peak of the GPU, when known"
    )
    peak_flops_source: str | None = None
    mfu: float | None = Field(default=None, description="achieved / datasheet peak FLOP/s (GPU only)")
    bytes_moved_per_step: int = Field(description="estimate: bytes read and written by every non-view op")
    arithmetic_intensity: float = Field(description="FLOPs per byte moved")
    attainable_bytes_per_s: float = Field(description="a large tensor copy, measured in this run")
    per_op_overhead_s: float = Field(description="cost of dispatching one tiny op, measured in this run")

    peak_memory_bytes: int
    peak_memory_kind: Literal["cuda_max_allocated", "cpu_rss_growth"]

    ops_per_step: float = Field(description="operator dispatches per step (below autograd)")
    median_op_time_s: float = Field(description="median self time of one profiled operator call")
    top_ops: list[OpTime]
    op_categories: list[CategoryTime]
    phases: list[PhaseTime]
    modules: list[ModuleTime]
    host_syncs: list[HostSync]
    host_syncs_per_step: int
    sync_wait_s: float | None = Field(
        default=None,
        description="GPU: host time per step blocked in cudaStreamSynchronize/cudaDeviceSynchronize/"
        "cudaEventSynchronize (what the syncs cost)",
    )
    conv_weights_channels_last: bool | None = Field(
        default=None, description="whether every Conv2d weight is channels_last; None without Conv2d"
    )

    compile: CompileReport | None = None
    probe_error: str | None = Field(
        default=None,
        description="why the instrumented step (FLOPs, bytes, syncs) failed when the plain step did not; "
        "those figures are then 0",
    )
    trace_path: str | None = Field(default=None, description="where the Chrome trace was written")

    bottleneck: Bottleneck
    shares: BottleneckShares
    evidence: list[Evidence]
    verdict_uncertain: bool = Field(
        default=False,
        description="true when the timings behind `bottleneck` are a close call or disagree with what the op "
        "counts, FLOPs and bytes (which load does not change) imply: the verdict may differ on a quieter or "
        "busier machine",
    )
    uncertainty: list[str] = Field(
        default_factory=list, description="why the verdict is uncertain, one reason each"
    )
    findings: list[Finding]
    summary: str

"""profile_model's worker entry point: measure a real step, then say what bounds it.

Run by the warm worker as `torch_skills.profiling.worker:run` (the server's `profile_model` tool), or
in-process in tests: `run(ProfileRequest(model="net.py:build", input_shape=[32, 64]), job)`.

What it does, in order (each stage reports progress):
1. builds the model, the batches (or the user's loader), the loss, the optimizer, the precision;
2. runs the first step under FlopCounterMode and a counting dispatch mode -> FLOPs, bytes moved, op
   dispatches, host syncs with their module and source line (probe.py; the optimizer making its
   state is left out, so the counts are a later step's); this is the first warm-up step, so it
   costs no extra run of the user's step;
3. times the other warmup + the active steps without the profiler (CUDA synchronized; long steps
   run fewer: the warm-up stops past WARMUP_BUDGET_S after 2 steps, the timing past
   TIMING_BUDGET_S after 3) -> median, IQR, loader wait, peak memory;
4. measures what this machine attains now: a large matmul in the step's dtype, a large copy, one
   tiny op (calibrate.py);
5. runs the active steps under torch.profiler (fewer, not under 2, when a step is long:
   `profiled_steps`; on a GPU after one profiler warm-up step) -> top ops, categories, phases,
   module times, the profiler's own overhead, and the optional Chrome trace (trace.py);
6. optionally times torch.compile(model) (compiled.py);
7. classifies the bottleneck (classify.py) and writes findings and a summary (findings.py).

Known limitations: peak memory on a CPU is the growth of the process's resident set over the
baseline taken before the model was built (it includes allocator caching and the loader's
prefetched batches in this process); the step is the tool's own loop (see step.py), so a
training loop's extra work (logging, gradient clipping, schedulers) is not in it unless the
model or the loss does it.
"""

from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401 - optimizers and FlopCounterMode import it on first use (~2 s): preload it

from torch_skills.profiling.calibrate import Calibration, calibrate
from torch_skills.profiling.classify import SMALL_OP_FACTOR, StepEvidence, classify
from torch_skills.profiling.compiled import compare_compiled
from torch_skills.profiling.findings import findings_for, summary_for
from torch_skills.profiling.models import (
    CompileReport,
    LoaderInfo,
    ModuleTime,
    ProfileRequest,
    ProfileResult,
    StepTiming,
)
from torch_skills.profiling.peaks import PeakDType, peak_flops
from torch_skills.profiling.probe import Probe, probe_step
from torch_skills.profiling.stats import summarize
from torch_skills.profiling.step import MATMUL_DTYPE, StepRunner, build_step, top_level_modules
from torch_skills.profiling.timing import TimedSteps, time_steps
from torch_skills.profiling.trace import TraceSummary, profiled_pass
from torch_skills.runner.errors import UserCodeError
from torch_skills.runner.threads import load_average, run_threads, usable_cores

# Profiler warm-up steps per device type: the model is warm by then; CUPTI's tracing settles over
# one step on a GPU, a CPU profiler needs none.
PROFILER_WARMUP_STEPS = {"cpu": 0, "cuda": 1}
WARMUP_BUDGET_S = 2.0  # warm-up stops past this (after 2 steps): the step is warm by then
TIMING_BUDGET_S = 5.0  # timed steps stop past this (after MIN_TIMED_STEPS): a long step's median is stable
PROFILE_BUDGET_S = 1.5  # profiled steps past this much step time add little: a long step is stable
MIN_PROFILED_STEPS = 2  # the work fraction is a median over the profiled steps: keep two


def _probe_first_step(runner: StepRunner) -> tuple[Probe, str | None]:
    """The FLOP/byte/sync probe over the first step, which is the first warm-up step too; the first
    line of the probe's error when that step failed under it (an error of the step itself shows again
    in the plain warm-up step that follows; if that step runs clean, the probe was at fault)."""
    try:
        return probe_step(runner, first_step=True), None
    except UserCodeError as exc:
        return Probe.empty(), exc.message.splitlines()[0][:500]


def profiled_steps(active_steps: int, step_time_s: float) -> int:
    """How many steps to run under the profiler: `active_steps`, fewer (not under 2) when the timed
    steps are long, so that the profiled pass takes about PROFILE_BUDGET_S of step time."""
    if step_time_s <= 0:
        return active_steps
    return max(MIN_PROFILED_STEPS, min(active_steps, math.ceil(PROFILE_BUDGET_S / step_time_s)))


STAGES = 7


def _proc_status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        return None
    return None


def _reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the peak seen is this run's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def resolve_trace_path(trace_path: str | None, job) -> Path | None:
    """Absolute path for the trace, refused outside the allowed roots or over an existing file;
    its folder is created. The file itself is written without replacing anything (write_trace)."""
    if trace_path is None:
        return None
    path = Path(trace_path).expanduser()
    path = Path(os.path.realpath(path if path.is_absolute() else Path(job.cwd) / path))
    roots = [Path(os.path.realpath(r)) for r in job.allowed_roots]
    if not any(path == r or path.is_relative_to(r) for r in roots):
        allowed = ", ".join(str(r) for r in roots) or "none"
        raise UserCodeError(
            "bad_request",
            f"trace_path {path} is outside the allowed roots ({allowed}); write it under one of them",
        )
    if os.path.lexists(path):
        raise UserCodeError(
            "bad_request",
            f"trace_path {path} already exists and is never overwritten; pick another name "
            f"(e.g. {path.with_name(path.stem + '-2' + path.suffix).name}) or delete the old trace first",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _thread_words(threads: int) -> str:
    return f"{threads} thread" if threads == 1 else f"{threads} threads"


def _device_name(device: torch.device, threads: int) -> str:
    """The GPU's name, or the CPU model with the intra-op threads the steps ran with."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model
            )
    except OSError:
        pass
    return f"cpu: {model} ({_thread_words(threads)})"


def _peak_dtype(precision: str) -> PeakDType:
    if precision in ("bf16", "bf16_autocast"):
        return "bf16"
    if precision in ("fp16", "fp16_autocast"):
        return "fp16"
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def _cpu_load() -> float | None:
    """1-minute load average per usable core, or None where the OS does not say."""
    load = load_average()
    return None if load is None else load / usable_cores()


def run(request: ProfileRequest, job) -> ProfileResult:
    """Profile the step the request describes; see the module docstring for the stages."""
    threads = torch.get_num_threads()
    run_threads(request.cpu_threads)  # already set in a worker child; here for in-process calls too
    try:
        measured = _measure(request, job)
    finally:
        torch.set_num_threads(threads)
    job.progress(STAGES - 1, STAGES, "classifying the bottleneck")
    result = _result(request, measured)
    job.progress(STAGES, STAGES, "done")
    return result


@dataclass
class _Measured:
    device: torch.device
    runner: StepRunner
    timed: TimedSteps
    peak_memory_bytes: int
    memory_kind: str
    cal: Calibration
    probe: Probe
    trace: TraceSummary
    compile_report: CompileReport | None
    cpu_loads: list[float | None]
    probe_error: str | None
    threads: int  # torch.get_num_threads() while the steps ran (run() restores the caller's afterwards)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"


def _measure(request: ProfileRequest, job) -> _Measured:
    loads = [_cpu_load()]
    device = torch.device("cuda" if job.device == "cuda" else "cpu")
    on_gpu = device.type == "cuda"
    trace_path = resolve_trace_path(request.trace_path, job)

    job.progress(0, STAGES, "building the model, the batches and the step")
    baseline_rss = _proc_status_bytes("VmRSS") or 0
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
    runner = build_step(request, job, device)

    job.progress(1, STAGES, "counting FLOPs, bytes, ops and host syncs over the first step")
    _reset_peak_rss()
    started = time.perf_counter()
    probe, probe_error = _probe_first_step(runner)
    probe_s = time.perf_counter() - started

    job.progress(
        2, STAGES, f"timing up to {request.warmup_steps}+{request.active_steps} steps without the profiler"
    )
    timed = time_steps(
        runner,
        warmup=request.warmup_steps - 1 + (probe_error is not None),  # the probe was the first warm-up
        active=request.active_steps,
        budget_s=TIMING_BUDGET_S,
        warmup_budget_s=WARMUP_BUDGET_S,
        prior_steps=1,
        prior_s=probe_s,
    )
    if on_gpu:
        peak_memory, memory_kind = torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    else:
        peak_memory, memory_kind = max((_proc_status_bytes("VmHWM") or 0) - baseline_rss, 0), "cpu_rss_growth"

    job.progress(3, STAGES, "measuring the attainable matmul rate, copy rate and per-op cost")
    cal = calibrate(device, MATMUL_DTYPE[request.precision])

    profiled = profiled_steps(request.active_steps, summarize(timed.times_s).median)
    job.progress(4, STAGES, f"profiling {profiled} steps with torch.profiler")
    trace = profiled_pass(
        runner,
        warmup=PROFILER_WARMUP_STEPS[device.type],
        active=profiled,
        small_op_s=SMALL_OP_FACTOR * cal.tiny_op_s,  # used where the profiled yardstick is missing (GPU)
        top_k=request.top_k,
        trace_path=trace_path,
    )

    compile_report = None
    if request.compile:
        job.progress(5, STAGES, "compiling the model with torch.compile and timing it")
        eager = summarize(timed.times_s).median
        compile_report = compare_compiled(
            runner, eager, warmup=request.warmup_steps, active=request.active_steps
        )
    loads.append(_cpu_load())
    return _Measured(
        device,
        runner,
        timed,
        int(peak_memory),
        memory_kind,
        cal,
        probe,
        trace,
        compile_report,
        loads,
        probe_error,
        torch.get_num_threads(),
    )


def _modules(m: _Measured) -> list[ModuleTime]:
    forward = next((p.cpu_time_s for p in m.trace.phases if p.phase == "forward"), 0.0)
    out = []
    for name, child in top_level_modules(m.runner.model):
        host, device = m.trace.module_times.get(name, (0.0, None))
        out.append(
            ModuleTime(
                name=name,
                type=type(child).__name__,
                forward_time_s=host,
                forward_device_time_s=device,
                share_of_forward=host / forward if forward else 0.0,
                flops_per_step=m.probe.module_flops.get(name, 0),
            )
        )
    return out


def loader_info(iterable) -> LoaderInfo:
    """What the loader says about itself (a DataLoader's worker and pinning settings)."""

    def read(name: str, kind: type):
        value = getattr(iterable, name, None)
        return (
            kind(value)
            if isinstance(value, (int, bool)) and not (kind is int and isinstance(value, bool))
            else None
        )

    return LoaderInfo(
        type=type(iterable).__name__,
        num_workers=read("num_workers", int),
        pin_memory=read("pin_memory", bool),
        persistent_workers=read("persistent_workers", bool),
        prefetch_factor=read("prefetch_factor", int),
    )


def _result(request: ProfileRequest, m: _Measured) -> ProfileResult:
    timing = summarize(m.timed.times_s)
    profiled = summarize(m.trace.step_times_s)
    has_loader = request.data is not None
    syncs_per_step = sum(s.calls_per_step for s in m.probe.syncs)
    verdict = classify(
        StepEvidence(
            on_gpu=m.on_gpu,
            step_time_s=timing.median,
            fastest_step_s=timing.min,
            calibration_spread=m.cal.spread,
            step_spread=timing.max / timing.min if timing.min > 0 else 1.0,
            data_wait_share=m.timed.data_wait_share if has_loader else None,
            work_fraction=m.trace.work_fraction,
            flops_per_step=m.probe.flops,
            attainable_flops_per_s=m.cal.matmul_flops_per_s,
            bytes_per_step=m.probe.bytes_moved,
            attainable_bytes_per_s=m.cal.copy_bytes_per_s,
            ops_per_step=m.probe.ops,
            median_op_time_s=m.trace.median_op_time_s,
            per_op_overhead_s=m.trace.small_op_s / SMALL_OP_FACTOR,  # a tiny op timed like the others
            host_syncs_per_step=syncs_per_step,
        )
    )
    device_name = _device_name(m.device, m.threads)
    peak = peak_flops(device_name, _peak_dtype(request.precision)) if m.on_gpu else None
    achieved = m.probe.flops / timing.median if timing.median > 0 else 0.0
    result = ProfileResult(
        batch_rule=m.runner.batch_rule,
        loader=loader_info(m.runner.source.iterable) if has_loader else None,
        device=f"cuda:{torch.cuda.current_device()}" if m.on_gpu else "cpu",
        device_name=device_name,
        cpu_threads=m.threads,
        cpu_load=max((x for x in m.cpu_loads if x is not None), default=None),
        mode=request.mode,
        precision=request.precision,
        samples_per_step=m.timed.samples[0] if m.timed.samples else None,
        step_time_s=timing.median,
        step_time_iqr_s=timing.iqr,
        timing=StepTiming(median_s=timing.median, iqr_s=timing.iqr, min_s=timing.min, max_s=timing.max,
                          times_s=m.timed.times_s, noisy=timing.noisy),
        throughput_samples_per_s=m.timed.throughput,
        profiled_step_time_s=profiled.median,
        profiler_overhead_ratio=profiled.median / timing.median if timing.median > 0 else 1.0,
        data_wait_s=sum(m.timed.waits_s) / len(m.timed.waits_s) if has_loader else None,
        data_wait_share=m.timed.data_wait_share if has_loader else None,
        flops_per_step=m.probe.flops,
        achieved_flops_per_s=achieved,
        attainable_flops_per_s=m.cal.matmul_flops_per_s,
        peak_flops_per_s=peak.flops_per_s if peak else None,
        peak_flops_source=f"{peak.gpu} {peak.dtype}: {peak.source}" if peak else None,
        mfu=achieved / peak.flops_per_s if peak else None,
        bytes_moved_per_step=m.probe.bytes_moved,
        arithmetic_intensity=m.probe.flops / m.probe.bytes_moved if m.probe.bytes_moved else 0.0,
        attainable_bytes_per_s=m.cal.copy_bytes_per_s,
        per_op_overhead_s=m.cal.tiny_op_s,
        peak_memory_bytes=m.peak_memory_bytes,
        peak_memory_kind=m.memory_kind,
        ops_per_step=float(m.probe.ops),
        median_op_time_s=m.trace.median_op_time_s,
        top_ops=m.trace.top_ops,
        op_categories=m.trace.categories,
        phases=m.trace.phases,
        modules=_modules(m),
        host_syncs=m.probe.syncs,
        host_syncs_per_step=syncs_per_step,
        sync_wait_s=m.trace.sync_wait_s,
        conv_weights_channels_last=m.probe.conv_weights_channels_last,
        compile=m.compile_report,
        probe_error=m.probe_error,
        trace_path=m.trace.trace_path,
        bottleneck=verdict.bottleneck,
        shares=verdict.shares,
        evidence=verdict.evidence,
        verdict_uncertain=bool(verdict.uncertain),
        uncertainty=verdict.uncertain,
        findings=[],
        summary="",
    )  # fmt: skip
    result.findings = findings_for(result)
    result.summary = summary_for(result)
    return result

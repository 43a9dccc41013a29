"""profile_model's worker entry point: measure a real step, then say what bounds it.

Run by the warm worker as `tools.profiling.worker:run` (the server's `profile_model` tool), or
in-process in tests: `run(ProfileRequest(model="net.py:build", input_shape=[32, 64]), job)`.

What it does, in order (each stage reports progress):
1. builds the model, the batches (or the user's loader), the loss, the optimizer, the precision;
2. times warmup + active steps without the profiler (CUDA synchronized) -> median, IQR, loader wait,
   peak memory;
3. measures what this machine attains now: a large matmul in the step's dtype, a large copy, one
   tiny op (calibrate.py);
4. runs one step under FlopCounterMode and a counting dispatch mode -> FLOPs, bytes moved, op
   dispatches, host syncs with their module and source line (probe.py);
5. runs 1 + active steps under torch.profiler -> top ops, categories, phases, module times, the
   profiler's own overhead, and the optional Chrome trace (trace.py);
6. optionally times torch.compile(model) (compiled.py);
7. classifies the bottleneck (classify.py) and writes findings and a summary (findings.py).

Known limitations: peak memory on a CPU is the growth of the process's resident set over the
baseline taken before the model was built (it includes allocator caching and the loader's
prefetched batches in this process); the step is the tool's own loop (see step.py), so a
training loop's extra work (logging, gradient clipping, schedulers) is not in it unless the
model or the loss does it.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401 - optimizers and FlopCounterMode import it on first use (~2 s): preload it

from tools.profiling.calibrate import calibrate
from tools.profiling.classify import SMALL_OP_FACTOR, StepEvidence, classify
from tools.profiling.compiled import compare_compiled
from tools.profiling.findings import findings_for, summary_for
from tools.profiling.models import ModuleTime, ProfileRequest, ProfileResult, StepTiming
from tools.profiling.peaks import PeakDType, peak_flops
from tools.profiling.probe import probe_step
from tools.profiling.stats import summarize
from tools.profiling.step import MATMUL_DTYPE, build_step
from tools.profiling.timing import time_steps
from tools.profiling.trace import profiled_pass
from tools.runner.errors import UserCodeError

PROFILER_WARMUP_STEPS = 1  # the model is warm already; one step lets the profiler settle
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
    """Absolute path for the trace, refused outside the allowed roots; its folder is created."""
    if trace_path is None:
        return None
    path = Path(trace_path).expanduser()
    path = Path(os.path.realpath(path if path.is_absolute() else Path(job.cwd) / path))
    roots = [Path(os.path.realpath(r)) for r in job.allowed_roots]
    if roots and not any(path == r or path.is_relative_to(r) for r in roots):
        allowed = ", ".join(str(r) for r in roots)
        raise UserCodeError(
            "bad_request",
            f"trace_path {path} is outside the allowed roots ({allowed}); write it under one of them",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _device_name(device: torch.device) -> str:
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
    return f"cpu: {model} ({torch.get_num_threads()} threads)"


def _peak_dtype(precision: str) -> PeakDType:
    if precision in ("bf16", "bf16_autocast"):
        return "bf16"
    if precision in ("fp16", "fp16_autocast"):
        return "fp16"
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def _cpu_load() -> float | None:
    """1-minute load average per usable core, or None where the OS does not say."""
    try:
        cores = len(os.sched_getaffinity(0))
        return os.getloadavg()[0] / max(cores, 1)
    except (OSError, AttributeError):
        return None


def run(request: ProfileRequest, job) -> ProfileResult:
    """Profile the step the request describes; see the module docstring for the stages."""
    threads = torch.get_num_threads()
    if request.cpu_threads is not None:
        torch.set_num_threads(request.cpu_threads)
    try:
        return _profile(request, job)
    finally:
        torch.set_num_threads(threads)


def _profile(request: ProfileRequest, job) -> ProfileResult:
    loads = [_cpu_load()]
    device = torch.device("cuda" if job.device == "cuda" else "cpu")
    on_gpu = device.type == "cuda"
    trace_path = resolve_trace_path(request.trace_path, job)

    job.progress(0, STAGES, "building the model, the batches and the step")
    baseline_rss = _proc_status_bytes("VmRSS") or 0
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
    runner = build_step(request, job, device)

    job.progress(
        1, STAGES, f"timing {request.warmup_steps} + {request.active_steps} steps without the profiler"
    )
    _reset_peak_rss()
    timed = time_steps(runner, warmup=request.warmup_steps, active=request.active_steps)
    if on_gpu:
        peak_memory, memory_kind = torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    else:
        peak = _proc_status_bytes("VmHWM") or 0
        peak_memory, memory_kind = max(peak - baseline_rss, 0), "cpu_rss_growth"
    timing = summarize(timed.times_s)

    job.progress(2, STAGES, "measuring the attainable matmul rate, copy rate and per-op cost")
    cal = calibrate(device, MATMUL_DTYPE[request.precision])

    job.progress(3, STAGES, "counting FLOPs, bytes, ops and host syncs over one step")
    probe = probe_step(runner)

    job.progress(4, STAGES, f"profiling {request.active_steps} steps with torch.profiler")
    trace = profiled_pass(
        runner,
        warmup=PROFILER_WARMUP_STEPS,
        active=request.active_steps,
        small_op_s=SMALL_OP_FACTOR * cal.tiny_op_s,
        top_k=request.top_k,
        trace_path=trace_path,
    )
    profiled = summarize(trace.step_times_s)

    compile_report = None
    if request.compile:
        job.progress(5, STAGES, "compiling the model with torch.compile and timing it")
        compile_report = compare_compiled(
            runner, timing.median, warmup=request.warmup_steps, active=request.active_steps
        )

    loads.append(_cpu_load())
    job.progress(6, STAGES, "classifying the bottleneck")
    syncs_per_step = sum(s.calls_per_step for s in probe.syncs)
    has_loader = request.data is not None
    verdict = classify(
        StepEvidence(
            on_gpu=on_gpu,
            step_time_s=timing.median,
            data_wait_share=timed.data_wait_share if has_loader else None,
            work_fraction=trace.work_fraction,
            flops_per_step=probe.flops,
            attainable_flops_per_s=cal.matmul_flops_per_s,
            bytes_per_step=probe.bytes_moved,
            attainable_bytes_per_s=cal.copy_bytes_per_s,
            ops_per_step=probe.ops,
            median_op_time_s=trace.median_op_time_s,
            per_op_overhead_s=trace.small_op_s
            / SMALL_OP_FACTOR,  # a tiny op under the profiler, like the others
            host_syncs_per_step=syncs_per_step,
        )
    )
    device_name = _device_name(device)
    peak = peak_flops(device_name, _peak_dtype(request.precision)) if on_gpu else None
    achieved = probe.flops / timing.median if timing.median > 0 else 0.0
    forward_time = next((p.cpu_time_s for p in trace.phases if p.phase == "forward"), 0.0)
    modules = [
        ModuleTime(
            name=name,
            type=type(child).__name__,
            forward_time_s=trace.module_times.get(name, (0.0, None))[0],
            forward_device_time_s=trace.module_times.get(name, (0.0, None))[1],
            share_of_forward=trace.module_times.get(name, (0.0, None))[0] / forward_time
            if forward_time
            else 0.0,
            flops_per_step=probe.module_flops.get(name, 0),
        )
        for name, child in runner.model.named_children()
    ]
    result = ProfileResult(
        device=str(device) if not on_gpu else f"cuda:{torch.cuda.current_device()}",
        device_name=device_name,
        cpu_load=max((x for x in loads if x is not None), default=None),
        mode=request.mode,
        precision=request.precision,
        samples_per_step=timed.samples[0] if timed.samples else None,
        step_time_s=timing.median,
        step_time_iqr_s=timing.iqr,
        timing=StepTiming(
            median_s=timing.median,
            iqr_s=timing.iqr,
            min_s=timing.min,
            max_s=timing.max,
            times_s=timed.times_s,
            noisy=timing.noisy,
        ),
        throughput_samples_per_s=timed.throughput,
        profiled_step_time_s=profiled.median,
        profiler_overhead_ratio=profiled.median / timing.median if timing.median > 0 else 1.0,
        data_wait_s=sum(timed.waits_s) / len(timed.waits_s) if has_loader else None,
        data_wait_share=timed.data_wait_share if has_loader else None,
        flops_per_step=probe.flops,
        achieved_flops_per_s=achieved,
        attainable_flops_per_s=cal.matmul_flops_per_s,
        peak_flops_per_s=peak.flops_per_s if peak else None,
        peak_flops_source=f"{peak.gpu} {peak.dtype}: {peak.source}" if peak else None,
        mfu=achieved / peak.flops_per_s if peak else None,
        bytes_moved_per_step=probe.bytes_moved,
        arithmetic_intensity=probe.flops / probe.bytes_moved if probe.bytes_moved else 0.0,
        attainable_bytes_per_s=cal.copy_bytes_per_s,
        per_op_overhead_s=cal.tiny_op_s,
        peak_memory_bytes=int(peak_memory),
        peak_memory_kind=memory_kind,
        ops_per_step=float(probe.ops),
        median_op_time_s=trace.median_op_time_s,
        top_ops=trace.top_ops,
        op_categories=trace.categories,
        phases=trace.phases,
        modules=modules,
        host_syncs=probe.syncs,
        host_syncs_per_step=syncs_per_step,
        conv_weights_channels_last=probe.conv_weights_channels_last,
        compile=compile_report,
        trace_path=trace.trace_path,
        bottleneck=verdict.bottleneck,
        shares=verdict.shares,
        evidence=verdict.evidence,
        findings=[],
        summary="",
    )
    result.findings = findings_for(result)
    result.summary = summary_for(result)
    job.progress(STAGES, STAGES, "done")
    return result

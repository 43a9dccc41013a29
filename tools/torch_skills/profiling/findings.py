"""Turn a measured profile into findings (each naming the skill to read next) and a summary (no torch).

Use `findings_for(result)` and `summary_for(result)` on a `ProfileResult` whose measurements are
filled in; the worker stores both back into the result.
"""

from __future__ import annotations

from collections import defaultdict

from torch_skills.profiling.models import ProfileResult
from torch_skills.results import Finding, format_bytes, format_flops, format_number, format_seconds

SECONDARY_SHARE = 0.2  # a part of the step this large earns a finding even when it is not the bottleneck
PROFILER_SKEW = 1.5  # above this slow-down, op shares under the profiler lean towards small ops
CONV_SHARE = 0.2  # convolutions this large a share of op time make the memory format matter
COMPILE_GAIN = 1.1  # a 10% gain from torch.compile is worth suggesting
OVERSUBSCRIBED = 1.0  # more runnable processes than cores: threads wait for a core


def _pct(x: float | None) -> str:
    """A share as a percentage with two significant digits below 10% (never a bare '0%' for a non-zero share)."""
    if x is None:
        return "n/a"
    if 0 < abs(x) < 0.1:
        return f"{format_number(x * 100, 2)}%"
    return f"{x:.0%}"


def _loader_advice(r: ProfileResult) -> str:
    """Advice built from the loader's settings as measured, never suggesting what it already does."""
    loader = r.loader
    gpu = r.device.startswith("cuda")
    if loader is None or loader.num_workers is None:
        return (
            "Time the loader alone (iterate it without the model) to see whether loading or the "
            "per-sample work in __getitem__ is the cost, then move that work out of the step."
        )
    if loader.num_workers == 0:
        extra = " and pin_memory=True" if gpu and not loader.pin_memory else ""
        return (
            f"It loads in the training process (num_workers=0): try num_workers > 0{extra}, and keep "
            "per-sample work in __getitem__ light."
        )
    tips = []
    if not loader.persistent_workers:
        tips.append("persistent_workers=True (workers are restarted every epoch otherwise)")
    if gpu and not loader.pin_memory:
        tips.append("pin_memory=True")
    more = f" Also set {' and '.join(tips)}." if tips else ""
    return (
        f"It already has num_workers={loader.num_workers}, so more processes are not the measured fix: "
        "the per-sample work (__getitem__, transforms, collate) is; time the loader alone and make that "
        f"work cheaper (pre-processed data, vectorized transforms, larger reads).{more}"
    )


def _bottleneck_finding(r: ProfileResult) -> Finding:
    s = r.shares
    step = format_seconds(r.step_time_s)
    if r.bottleneck == "data_loading":
        return Finding(
            severity="warning",
            code="data_bound",
            message=f"The step waits on the data loader for {_pct(s.data_wait)} of its {step}. "
            + _loader_advice(r),
            skill="performance-profiling",
        )
    if r.bottleneck == "cpu_overhead":
        gpu = r.device.startswith("cuda")
        fixes = (
            "capture the step with CUDA graphs (torch.compile(mode='reduce-overhead')), "
            if gpu
            else "fuse the small ops with torch.compile, "
        )
        return Finding(
            severity="warning",
            code="overhead_bound",
            message=f"{_pct(s.host_overhead)} of the {step} step is host overhead: {r.ops_per_step:.0f} "
            f"op dispatches per step, the median op {format_seconds(r.median_op_time_s)}. The arithmetic "
            f"would take {_pct(s.compute)} of the step. Do more work per op: larger batches, "
            f"{fixes}vectorize Python loops over layers or samples, use foreach/fused optimizers.",
            skill="performance-profiling",
        )
    if r.bottleneck == "compute":
        mfu = f", MFU {r.mfu:.0%} of the datasheet peak" if r.mfu is not None else ""
        lower = (
            " Run matmuls in bf16 (precision='bf16_autocast') or enable TF32 for the next step up."
            if r.precision == "fp32"
            else " Lower precision is already on: next are larger matmuls and fewer FLOPs."
        )
        return Finding(
            severity="info",
            code="compute_bound",
            message=f"The step is bound by arithmetic: {format_flops(r.flops_per_step)} per step at "
            f"{format_flops(r.achieved_flops_per_s)}/s, {_pct(s.compute)} of the matmul rate this machine "
            f"attains{mfu}.{lower}",
            skill="mixed-precision-and-optimization",
        )
    if r.bottleneck == "memory_bandwidth":
        return Finding(
            severity="info",
            code="memory_bound",
            message=f"The step is bound by memory traffic: about {format_bytes(r.bytes_moved_per_step)} moved "
            f"per step at {r.arithmetic_intensity:.2f} FLOP/byte, {_pct(s.memory_bandwidth)} of the step at "
            "the attainable copy rate. Fuse elementwise and normalization ops (torch.compile), avoid copies "
            "and .contiguous() calls, use channels_last for convolutions, halve the bytes with bf16.",
            skill="tensor-operations-and-memory",
        )
    return Finding(
        severity="info",
        code="bottleneck_unknown",
        message=f"No single resource explains the {step} step: work {_pct(s.work)}, host overhead "
        f"{_pct(s.host_overhead)}, compute {_pct(s.compute)}, memory {_pct(s.memory_bandwidth)} of it. "
        "Open the trace (trace_path) and read the longest ops and the gaps between them.",
        skill="performance-profiling",
    )


def _sync_findings(r: ProfileResult) -> list[Finding]:
    by_place: dict[tuple[str, str | None], list] = defaultdict(list)
    for sync in r.host_syncs:
        by_place[(sync.op, sync.location)].append(sync)
    gpu = r.device.startswith("cuda")
    out = []
    for (op, location), syncs in sorted(
        by_place.items(), key=lambda kv: -sum(s.calls_per_step for s in kv[1])
    ):
        calls = sum(s.calls_per_step for s in syncs)
        modules = sorted({s.module for s in syncs if s.module})
        shown = ", ".join(modules[:6]) + (f" and {len(modules) - 6} more" if len(modules) > 6 else "")
        where = f" at {location}" if location else ""
        inside = f" in {shown}" if shown else ""
        waited = (
            f" (the host waits {format_seconds(r.sync_wait_s)} per step in CUDA syncs)"
            if r.sync_wait_s
            else ""
        )
        cost = (
            f"each one stalls the host until the GPU catches up{waited}"
            if gpu
            else "cheap on a CPU, but each one becomes a GPU sync once the model runs on CUDA"
        )
        out.append(
            Finding(
                severity="warning" if gpu else "info",
                code="host_sync",
                message=f"{calls} x {op} per step{where}{inside}: {cost}. Keep values as tensors "
                "(torch.where instead of if, accumulate metrics on the device and read them every N steps).",
                skill="performance-profiling",
            )
        )
    return out[:8]


def findings_for(r: ProfileResult) -> list[Finding]:
    """Every finding the measurements support, the bottleneck first."""
    out = [_bottleneck_finding(r)]
    s = r.shares
    if r.bottleneck != "data_loading" and s.data_wait is not None and s.data_wait >= SECONDARY_SHARE:
        out.append(
            Finding(
                severity="warning",
                code="data_wait",
                message=f"The loader still takes {_pct(s.data_wait)} of the step. " + _loader_advice(r),
                skill="performance-profiling",
            )
        )
    if r.bottleneck != "cpu_overhead" and s.host_overhead >= SECONDARY_SHARE and r.ops_per_step >= 20:
        out.append(
            Finding(
                severity="info",
                code="host_overhead",
                message=f"Host overhead is {_pct(s.host_overhead)} of the step ({r.ops_per_step:.0f} "
                "ops per step); fusing small ops would shave it.",
                skill="performance-profiling",
            )
        )
    out += _sync_findings(r)
    conv = next((c.share for c in r.op_categories if c.category == "convolution"), 0.0)
    if conv >= CONV_SHARE and r.conv_weights_channels_last is False:
        out.append(
            Finding(
                severity="info",
                code="channels_last",
                message=f"Convolutions take {conv:.0%} of op time in the NCHW layout; "
                "model.to(memory_format=torch.channels_last) with channels_last inputs lets cuDNN "
                "(tensor cores) and oneDNN skip layout conversions around every conv.",
                skill="tensor-operations-and-memory",
            )
        )
    if r.cpu_load is not None and r.cpu_load > OVERSUBSCRIBED and not r.device.startswith("cuda"):
        out.append(
            Finding(
                severity="warning",
                code="cpu_contention",
                message=f"The machine was oversubscribed during the run (load {r.cpu_load:.1f} per core): "
                + _contention_advice(r),
                skill="performance-profiling",
            )
        )
    if r.timing.noisy:
        out.append(
            Finding(
                severity="info",
                code="noisy_timing",
                message=f"Step times vary: IQR {format_seconds(r.step_time_iqr_s)} is "
                f"{r.step_time_iqr_s / r.step_time_s:.0%} of the median. The machine is busy or the step "
                "changes between calls; raise active_steps and compare runs with care.",
                skill="performance-profiling",
            )
        )
    if r.profiler_overhead_ratio >= PROFILER_SKEW:
        out.append(
            Finding(
                severity="info",
                code="profiler_overhead",
                message=f"The profiler slowed the step {r.profiler_overhead_ratio:.1f}x; its per-op "
                "times overstate small ops. step_time_s is measured without it.",
                skill="performance-profiling",
            )
        )
    if r.probe_error is not None:
        out.append(
            Finding(
                severity="warning",
                code="probe_failed",
                message=f"Counting FLOPs, bytes and syncs failed ({r.probe_error}); those figures are 0 "
                "and the verdict rests on the timings alone.",
                skill="performance-profiling",
            )
        )
    if r.compile is not None:
        out += _compile_findings(r)
    return out


def _compile_findings(r: ProfileResult) -> list[Finding]:
    c = r.compile
    assert c is not None
    if c.status == "failed":
        return [
            Finding(
                severity="warning",
                code="compile_failed",
                message=f"torch.compile(model) failed: {(c.error or '')[:400]}. Eager numbers stand; "
                "fix the error or compile submodules that do compile.",
                skill="performance-profiling",
            )
        ]
    out = []
    if c.speedup is not None and c.speedup >= COMPILE_GAIN:
        out.append(
            Finding(
                severity="info",
                code="compile_speedup",
                message=f"torch.compile makes the step {c.speedup:.2f}x faster "
                f"({format_seconds(c.step_time_s or 0)} vs {format_seconds(r.step_time_s)}) after "
                f"{format_seconds(c.compile_time_s or 0)} of compilation: worth it for runs longer "
                "than a few hundred steps.",
                skill="mixed-precision-and-optimization",
            )
        )
    elif c.speedup is not None:
        out.append(
            Finding(
                severity="info",
                code="compile_no_gain",
                message=f"torch.compile gives {c.speedup:.2f}x on this step; the bottleneck is elsewhere.",
                skill="performance-profiling",
            )
        )
    if c.graph_breaks:
        reasons = "; ".join(c.graph_break_reasons[:3])
        out.append(
            Finding(
                severity="warning",
                code="graph_breaks",
                message=f"{c.graph_breaks} graph breaks under torch.compile ({reasons}); each splits "
                "the graph and costs fusion.",
                skill="performance-profiling",
            )
        )
    return out


def _contention_advice(r: ProfileResult) -> str:
    """What load does to this run's timings, and a next step it has not already taken."""
    if r.cpu_threads == 1:
        return (
            "this run already used 1 thread, so its step waited for a core whenever another process "
            "held it and the timings include that wait. Measure on a quiet machine, or compare "
            "several runs and trust the fastest."
        )
    return (
        f"the {r.cpu_threads} intra-op threads wait for each other and for a core, so small ops look slow "
        "and steps stall at random. Measure on a quiet machine, or call again with cpu_threads=1."
    )


def summary_for(r: ProfileResult) -> str:
    """Two or three sentences a person reads first."""
    rate = f", {format_number(r.throughput_samples_per_s)} samples/s" if r.throughput_samples_per_s else ""
    head = (
        f"{r.mode.capitalize()} step {format_seconds(r.step_time_s)} (IQR {format_seconds(r.step_time_iqr_s)}) "
        f"on {r.device_name} in {r.precision}{rate}."
    )
    s = r.shares
    why = {
        "data_loading": f"waiting on the loader is {_pct(s.data_wait)} of the step",
        "cpu_overhead": f"host overhead is {_pct(s.host_overhead)} of the step, "
        f"{r.ops_per_step:.0f} ops/step, median op {format_seconds(r.median_op_time_s)}",
        "compute": f"arithmetic at {_pct(s.compute)} of the attainable matmul rate",
        "memory_bandwidth": f"memory traffic at {_pct(s.memory_bandwidth)} of the attainable copy rate",
        "unknown": "no resource explains most of the step",
    }[r.bottleneck]
    top = f" Top op {r.top_ops[0].name} ({r.top_ops[0].share:.0%})." if r.top_ops else ""
    syncs = f" {r.host_syncs_per_step} host syncs/step." if r.host_syncs_per_step else ""
    comp = ""
    if r.compile is not None:
        comp = (
            f" torch.compile: {r.compile.speedup:.2f}x after {format_seconds(r.compile.compile_time_s or 0)}."
            if r.compile.status == "ok" and r.compile.speedup
            else " torch.compile failed."
        )
    doubt = f" The verdict is uncertain: {r.uncertainty[0]}." if r.verdict_uncertain and r.uncertainty else ""
    return (
        f"{head} {_verdict_words(r, why)}{doubt}{top}{syncs}{comp} "
        f"Profiler overhead {r.profiler_overhead_ratio:.2f}x."
    )


BOTTLENECK_WORDS = {
    "data_loading": "the data loader",
    "cpu_overhead": "host (CPU) overhead",
    "compute": "arithmetic",
    "memory_bandwidth": "memory traffic",
}
NEAR_LIMIT_SHARE = 0.5  # below half of a roofline limit, "bound by" it overstates what was measured


def _verdict_words(r: ProfileResult, why: str) -> str:
    """'Bound by X: why.', or, when the roofline resource picked is far from its limit, says so."""
    if r.bottleneck == "unknown":
        return f"No clear bottleneck: {why}."
    name = BOTTLENECK_WORDS[r.bottleneck]
    share = {"compute": r.shares.compute, "memory_bandwidth": r.shares.memory_bandwidth}.get(r.bottleneck)
    if share is not None and share < NEAR_LIMIT_SHARE:
        return (
            f"Closest to the {name} limit, but at only {_pct(share)} of it: no resource is near its limit, "
            "so small shapes, per-op fixed costs or slow kernels take the rest."
        )
    return f"Bound by {name}: {why}."

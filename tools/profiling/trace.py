"""The profiled pass: run steps under torch.profiler and boil the events down to tables.

Use `profiled_pass(runner, warmup=1, active=10, small_op_s=3e-5, top_k=15, trace_path=None)` ->
`TraceSummary`. Each step's phases ("## phase: forward", ...) and each top-level submodule's
forward ("## module: encoder") are marked with `record_function`, so the trace shows them and the
summary can total them. Times are per step (the profiler's totals divided by the active steps).

On a GPU the tables rank operators by the CUDA time of the kernels they launched (the device is
what bounds the step), and `work_time_s` is the total kernel time per step; on a CPU they rank by
self CPU time, and `work_time_s` is the self time of operators longer than `small_op_s`, outside
the data phase.

Known limitations: kernels that overlap on several streams are summed, so GPU work can exceed the
step time (the classifier clips it); module times cover the forward pass only (backward runs in the
autograd engine, outside any module call).
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile, schedule

from tools.profiling.calibrate import synchronizer
from tools.profiling.categories import op_category
from tools.profiling.models import CategoryTime, OpTime, PhaseTime
from tools.profiling.step import StepRunner

CALL_CAP_FACTOR = 4.0  # one call of an op longer than 4x its median is taken as preempted, not slower
PHASE_PREFIX = "## phase: "
MODULE_PREFIX = "## module: "


@dataclass
class TraceSummary:
    step_times_s: list[float]
    steps: int
    top_ops: list[OpTime]
    categories: list[CategoryTime]
    phases: list[PhaseTime]
    module_times: dict[str, tuple[float, float | None]]  # name -> (host s, device s) per step
    work_time_s: float
    median_op_time_s: float
    sync_wait_s: float | None  # GPU: host time blocked in cuda*Synchronize per step
    trace_path: str | None


def _phase_marker(name: str) -> record_function:
    return record_function(PHASE_PREFIX + name)


class _ModuleMarkers:
    """record_function ranges around every top-level submodule's forward, removed on exit."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.handles: list[Any] = []
        self.open: list[record_function] = []

    def __enter__(self) -> _ModuleMarkers:
        for name, child in self.model.named_children():
            self.handles.append(child.register_forward_pre_hook(self._enter(MODULE_PREFIX + name)))
            self.handles.append(child.register_forward_hook(self._leave))
        return self

    def _enter(self, label: str):
        def hook(_module, _args) -> None:
            marker = record_function(label)
            marker.__enter__()
            self.open.append(marker)

        return hook

    def _leave(self, _module, _args, _output) -> None:
        if self.open:
            self.open.pop().__exit__(None, None, None)

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        while self.open:
            self.open.pop().__exit__(None, None, None)


_SKIPPED = {
    "[memory]",
    "[OutOfMemory]",
    "profiler::_record_function_enter",
    "profiler::_record_function_enter_new",
    "profiler::_record_function_exit",
}


@dataclass(frozen=True)
class RawEvent:
    """One profiler event as kineto reports it (times in ns)."""

    name: str
    start_ns: int
    end_ns: int
    thread: int
    correlation_id: int
    linked_correlation_id: int
    on_device: bool  # a GPU kernel, memcpy or memset
    annotation: bool  # a record_function range (ours, the optimizer's, ProfilerStep#N)


def raw_events(prof: profile) -> list[RawEvent]:
    """The kineto events of the active steps, read directly (FunctionEvent parsing costs ~100 us/event)."""
    results = prof.profiler.kineto_results if prof.profiler is not None else None
    if results is None:
        return []
    out = []
    for e in results.events():
        name = e.name()
        if name in _SKIPPED or e.is_hidden_event():
            continue
        start = e.start_ns()
        out.append(
            RawEvent(
                name=name,
                start_ns=start,
                end_ns=start + e.duration_ns(),
                thread=e.start_thread_id(),
                correlation_id=e.correlation_id(),
                linked_correlation_id=e.linked_correlation_id(),
                on_device=e.device_type() != torch.autograd.DeviceType.CPU,
                annotation=e.is_user_annotation() or name.startswith("ProfilerStep"),
            )
        )
    return out


@dataclass
class _Node:
    event: RawEvent
    phase: str | None
    module: str | None
    children_ns: int = 0


def _nest(events: list[RawEvent]) -> list[_Node]:
    """Nodes with the phase and top-level module each host event ran in, and its children's time."""
    nodes: list[_Node] = []
    by_thread: dict[int, list[RawEvent]] = defaultdict(list)
    for e in events:
        if not e.on_device:
            by_thread[e.thread].append(e)
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (e.start_ns, -e.end_ns))
        stack: list[_Node] = []
        for e in thread_events:
            while stack and stack[-1].event.end_ns <= e.start_ns:
                stack.pop()
            parent = stack[-1] if stack else None
            phase = parent.phase if parent else None
            module = parent.module if parent else None
            if e.name.startswith(PHASE_PREFIX):
                phase = e.name[len(PHASE_PREFIX) :]
            elif e.name.startswith(MODULE_PREFIX):
                module = e.name[len(MODULE_PREFIX) :]
            node = _Node(e, phase, module)
            if parent is not None:
                parent.children_ns += e.end_ns - e.start_ns
            stack.append(node)
            nodes.append(node)
    return nodes


def _does_tensor_work(name: str, category: str) -> bool:
    """Operators do tensor work; autograd-engine bookkeeping and CUDA runtime calls are host overhead."""
    return category not in ("autograd", "host_sync") and not name.startswith("cuda")


def _substantial_time(call_times: list[float], small_op_s: float) -> float:
    """Self time of the calls of one op that do real work, robust to a call preempted by the OS.

    A call counts when it lasts longer than `small_op_s`; each call is first capped at
    CALL_CAP_FACTOR x the op's median call, so a 3 us op that was descheduled for 5 ms on a busy
    machine still reads as a 3 us op.
    """
    cap = CALL_CAP_FACTOR * statistics.median(call_times)
    return sum(t for t in (min(t, cap) for t in call_times) if t > small_op_s)


def summarize_events(
    events: list[RawEvent], steps: int, *, on_gpu: bool, small_op_s: float, top_k: int
) -> dict[str, Any]:
    """Top ops, categories, phase and module times, work time from the events of `steps` steps."""
    device_ns: dict[int, int] = defaultdict(int)  # launching op's correlation id -> kernel ns
    kernel_ns = 0
    for e in events:
        if e.on_device:
            kernel_ns += e.end_ns - e.start_ns
            device_ns[e.linked_correlation_id] += e.end_ns - e.start_ns
    per_name: dict[tuple[str, str], list[float]] = defaultdict(
        lambda: [0.0, 0.0, 0.0]
    )  # cpu s, device s, calls
    phase_cpu: dict[str, float] = defaultdict(float)
    phase_dev: dict[str, float] = defaultdict(float)
    module_cpu: dict[str, float] = defaultdict(float)
    module_dev: dict[str, float] = defaultdict(float)
    op_times: list[float] = []
    call_times: dict[str, list[float]] = defaultdict(list)  # CPU: self time of each op call, outside data
    step_cpu = sync_wait = 0.0
    for node in _nest(events):
        e = node.event
        duration = (e.end_ns - e.start_ns) * 1e-9
        if e.name.startswith("ProfilerStep"):
            step_cpu += duration
        elif e.name.startswith(PHASE_PREFIX):
            phase_cpu[e.name[len(PHASE_PREFIX) :]] += duration
        elif e.name.startswith(MODULE_PREFIX):
            module_cpu[e.name[len(MODULE_PREFIX) :]] += duration
        if e.annotation or e.name.startswith("## "):
            continue
        self_cpu = (e.end_ns - e.start_ns - node.children_ns) * 1e-9
        self_dev = (
            device_ns.get(e.correlation_id, 0) * 1e-9 if on_gpu and e.linked_correlation_id == 0 else 0.0
        )
        category = op_category(e.name, node.phase)
        entry = per_name[(e.name, category)]
        entry[0] += self_cpu
        entry[1] += self_dev
        entry[2] += 1
        if node.phase is not None:
            phase_dev[node.phase] += self_dev
        if node.module is not None:
            module_dev[node.module] += self_dev
        if e.name.startswith("aten::"):
            op_times.append(self_cpu)
        if category == "host_sync" and e.name.startswith("cuda"):
            sync_wait += self_cpu
        if not on_gpu and node.phase != "data" and _does_tensor_work(e.name, category):
            call_times[e.name].append(self_cpu)

    n = max(steps, 1)
    work = sum(_substantial_time(times, small_op_s) for times in call_times.values())
    primary = 1 if on_gpu else 0
    total = sum(v[primary] for v in per_name.values()) or 1.0
    ranked = sorted(per_name.items(), key=lambda kv: -kv[1][primary])
    top_ops = [
        OpTime(
            name=name,
            category=category,  # type: ignore[arg-type]
            calls_per_step=calls / n,
            self_time_s=(dev if on_gpu else cpu) / n,
            self_cpu_time_s=cpu / n,
            self_device_time_s=dev / n if on_gpu else None,
            share=(dev if on_gpu else cpu) / total,
        )
        for (name, category), (cpu, dev, calls) in ranked[:top_k]
    ]
    by_category: dict[str, float] = defaultdict(float)
    for (_, category), values in per_name.items():
        by_category[category] += values[primary]
    categories = [
        CategoryTime(category=c, self_time_s=t / n, share=t / total)  # type: ignore[arg-type]
        for c, t in sorted(by_category.items(), key=lambda kv: -kv[1])
    ]
    step_host = (step_cpu or sum(phase_cpu.values())) / n
    phases = [
        PhaseTime(
            phase=p,  # type: ignore[arg-type]
            cpu_time_s=phase_cpu[p] / n,
            device_time_s=phase_dev[p] / n if on_gpu else None,
            share=(phase_cpu[p] / n) / step_host if step_host else 0.0,
        )
        for p in ("data", "forward", "loss", "backward", "optimizer")
        if p in phase_cpu
    ]
    return {
        "top_ops": top_ops,
        "categories": categories,
        "phases": phases,
        "module_times": {k: (module_cpu[k] / n, module_dev[k] / n if on_gpu else None) for k in module_cpu},
        "work_time_s": (kernel_ns * 1e-9 if on_gpu else work) / n,
        "median_op_time_s": statistics.median(op_times) if op_times else 0.0,
        "sync_wait_s": sync_wait / n if on_gpu else None,
    }


def profiled_pass(
    runner: StepRunner,
    *,
    warmup: int,
    active: int,
    small_op_s: float,
    top_k: int,
    trace_path: Path | None,
) -> TraceSummary:
    """Run warmup + active steps under torch.profiler; time the active ones; summarize their events."""
    on_gpu = runner.device.type == "cuda"
    sync = synchronizer(runner.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    times: list[float] = []
    with (
        _ModuleMarkers(runner.model),
        profile(
            activities=activities, schedule=schedule(wait=0, warmup=warmup, active=active, repeat=1)
        ) as prof,
    ):
        for index in range(warmup + active):
            sync()
            start = time.perf_counter()
            runner.checked_step(_phase_marker)
            sync()
            if index >= warmup:
                times.append(time.perf_counter() - start)
            prof.step()
    events = raw_events(prof)
    steps = sum(1 for e in events if e.name.startswith("ProfilerStep")) or active
    written = None
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
        written = str(trace_path)
    summary = summarize_events(events, steps, on_gpu=on_gpu, small_op_s=small_op_s, top_k=top_k)
    return TraceSummary(step_times_s=times, steps=steps, trace_path=written, **summary)

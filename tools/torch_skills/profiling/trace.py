"""The profiled pass: run steps under torch.profiler and boil the events down to tables.

Use `profiled_pass(runner, warmup=1, active=10, small_op_s=3e-5, top_k=15, trace_path=None)` ->
`TraceSummary`. Each step's phases ("## phase: forward", ...) and each top-level submodule's
forward ("## module: encoder") are marked with `record_function`, so the trace shows them and the
summary can total them. Times are per step (the profiler's totals divided by the active steps).
The kineto events are read directly (`raw_events`) and nested here: building torch's
FunctionEvent tree costs about 100 us per event, minutes for a model of many small ops.

On a GPU the tables rank operators by the CUDA time of the kernels they launched (the device is
what bounds the step), and the work is the kernel time; on a CPU they rank by self CPU time, and
the work is the self time of operator calls longer than `small_op_s` (20x a one-element add
profiled right after each step), outside the data phase, each call timed by its median over the
steps decides whether it is work (`cpu_work_per_step`). `work_fraction` is the median over the
steps of work / (step - data phase), two times taken in the same step: a call or a step slowed by
a busy machine does not skew it.

Known limitations: kernels that overlap on several streams are summed, so GPU work can exceed the
step time (it is clipped); module times cover the forward pass only (backward runs in the
autograd engine, outside any module call), and on a GPU backward kernels launched from the
autograd thread are not attributed to the backward phase's device time.
"""

from __future__ import annotations

import bisect
import os
import statistics
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile, schedule

from torch_skills.profiling.calibrate import synchronizer
from torch_skills.profiling.categories import op_category
from torch_skills.profiling.classify import SMALL_OP_FACTOR
from torch_skills.profiling.models import CategoryTime, OpTime, PhaseTime
from torch_skills.profiling.step import StepRunner, top_level_modules

PHASE_PREFIX = "## phase: "
MODULE_PREFIX = "## module: "
STEP_PREFIX = "ProfilerStep"
CALIBRATION = "## calibration: tiny ops"
TINY_OPS_PER_STEP = 50
PHASES = ("data", "forward", "loss", "backward", "optimizer")


@dataclass
class TraceSummary:
    step_times_s: list[float]
    steps: int
    top_ops: list[OpTime]
    categories: list[CategoryTime]
    phases: list[PhaseTime]
    module_times: dict[str, tuple[float, float | None]]  # name -> (host s, device s) per step
    work_time_s: float  # mean per step
    work_fraction: float  # median over steps of work / (step - data phase)
    small_op_s: float  # op calls shorter than this count as overhead, not work
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
        for name, child in top_level_modules(self.model):
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
                annotation=e.is_user_annotation() or name.startswith(STEP_PREFIX),
            )
        )
    return out


@dataclass
class _Node:
    event: RawEvent
    phase: str | None
    module: str | None
    step: int | None  # index of the ProfilerStep range it ran in
    children_ns: int = 0


def _nest(events: list[RawEvent], step_ranges: list[tuple[int, int]]) -> list[_Node]:
    """Host events with their phase, top-level module, step, and the time of their children."""
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
            elif e.name == CALIBRATION:
                phase = "calibration"
            elif e.name.startswith(MODULE_PREFIX):
                module = e.name[len(MODULE_PREFIX) :]
            node = _Node(e, phase, module, _step_of(e.start_ns, step_ranges))
            if parent is not None:
                parent.children_ns += e.end_ns - e.start_ns
            stack.append(node)
            nodes.append(node)
    return nodes


def _step_of(start_ns: int, step_ranges: list[tuple[int, int]]) -> int | None:
    """Index of the (sorted, disjoint) step range holding this time, or None."""
    index = bisect.bisect_right(step_ranges, (start_ns, float("inf"))) - 1
    if index >= 0 and step_ranges[index][0] <= start_ns < step_ranges[index][1]:
        return index
    return None


def _does_tensor_work(name: str, category: str) -> bool:
    """Operators do tensor work; autograd-engine bookkeeping and CUDA runtime calls are host overhead."""
    return category not in ("autograd", "host_sync") and not name.startswith("cuda")


def cpu_work_per_step(calls: list[tuple[int, int, str, float]], small_op_s: float) -> dict[int, float]:
    """Seconds of real work in each step, with calls preempted by the OS not mistaken for work.

    `calls` are (step, start_ns, name, self seconds). The k-th call of an op in one step is the same
    call as the k-th in the next (a step runs the same code each time), so a call is work when its
    median over the steps exceeds `small_op_s`: a 3 us op descheduled for 5 ms in one step stays
    overhead. A work call then counts with the time it took in that step, so that the step's work
    and the step's wall time come from the same moment.
    """
    ordinal_of: list[tuple[str, int]] = []
    by_call: dict[tuple[str, int], list[float]] = defaultdict(list)
    seen: dict[tuple[int, str], int] = defaultdict(int)
    ordered = sorted(calls)
    for step, _start, name, seconds in ordered:
        key = (name, seen[(step, name)])
        seen[(step, name)] += 1
        ordinal_of.append(key)
        by_call[key].append(seconds)
    is_work = {key for key, times in by_call.items() if statistics.median(times) > small_op_s}
    work: dict[int, float] = defaultdict(float)
    for (step, _start, _name, seconds), key in zip(ordered, ordinal_of, strict=True):
        if key in is_work:
            work[step] += seconds
    return work


@dataclass
class _Totals:
    """Running sums over the events, all in seconds."""

    ops: dict[tuple[str, str], list[float]] = field(
        default_factory=lambda: defaultdict(lambda: [0.0, 0.0, 0.0])
    )
    phase_cpu: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    phase_dev: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    module_cpu: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    module_dev: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    op_times: list[float] = field(default_factory=list)
    calls: list[tuple[int, int, str, float]] = field(default_factory=list)  # (step, start ns, name, self s)
    data_per_step: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    phases_per_step: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # all but data
    tiny_op_times: list[float] = field(default_factory=list)
    sync_wait: float = 0.0


def _accumulate(nodes: list[_Node], device_s: dict[int, float], on_gpu: bool) -> _Totals:
    t = _Totals()
    for node in nodes:
        e = node.event
        duration = (e.end_ns - e.start_ns) * 1e-9
        if e.name.startswith(PHASE_PREFIX):
            t.phase_cpu[node.phase or ""] += duration
            if node.step is not None:
                per_step = t.data_per_step if node.phase == "data" else t.phases_per_step
                per_step[node.step] += duration
        elif e.name.startswith(MODULE_PREFIX):
            t.module_cpu[node.module or ""] += duration
        if e.annotation or e.name.startswith("## "):
            continue
        self_cpu = (e.end_ns - e.start_ns - node.children_ns) * 1e-9
        if node.phase == "calibration":
            t.tiny_op_times.append(self_cpu)
            continue
        self_dev = device_s.get(e.correlation_id, 0.0) if on_gpu and e.linked_correlation_id == 0 else 0.0
        category = op_category(e.name, node.phase)
        entry = t.ops[(e.name, category)]
        entry[0] += self_cpu
        entry[1] += self_dev
        entry[2] += 1
        if node.phase is not None:
            t.phase_dev[node.phase] += self_dev
        if node.module is not None:
            t.module_dev[node.module] += self_dev
        if e.name.startswith("aten::"):
            t.op_times.append(self_cpu)
        if category == "host_sync" and e.name.startswith("cuda"):
            t.sync_wait += self_cpu
        if node.step is not None and node.phase != "data" and _does_tensor_work(e.name, category):
            t.calls.append((node.step, e.start_ns, e.name, self_cpu))
    return t


def summarize_events(
    events: list[RawEvent], *, on_gpu: bool, small_op_s: float, top_k: int
) -> dict[str, Any]:
    """Top ops, categories, phase and module times, and the work fraction of the profiled steps."""
    step_ranges = sorted((e.start_ns, e.end_ns) for e in events if e.name.startswith(STEP_PREFIX))
    steps = max(len(step_ranges), 1)
    device_s: dict[int, float] = defaultdict(float)  # launching op's correlation id -> kernel seconds
    kernel_per_step: dict[int, float] = defaultdict(float)
    for e in events:
        if e.on_device:
            seconds = (e.end_ns - e.start_ns) * 1e-9
            device_s[e.linked_correlation_id] += seconds
            step = _step_of(e.start_ns, step_ranges)
            if step is not None:
                kernel_per_step[step] += seconds
    totals = _accumulate(_nest(events, step_ranges), device_s, on_gpu)
    tiny_op_s = statistics.median(totals.tiny_op_times) if totals.tiny_op_times else None
    if tiny_op_s is not None:  # measured under the profiler, in the same steps: the fairest yardstick
        small_op_s = SMALL_OP_FACTOR * tiny_op_s
    busy_per_step = []
    for index, (begin, end) in enumerate(step_ranges):
        if on_gpu:  # the sync after the step waits for the kernels: the whole range counts
            busy_per_step.append((end - begin) * 1e-9 - totals.data_per_step.get(index, 0.0))
        else:  # the phases, leaving out the tiny-op calibration that follows each step
            busy_per_step.append(totals.phases_per_step.get(index, 0.0))
    work_per_step = kernel_per_step if on_gpu else cpu_work_per_step(totals.calls, small_op_s)
    fractions = [
        min(1.0, work_per_step.get(i, 0.0) / busy) for i, busy in enumerate(busy_per_step) if busy > 0
    ]
    return {
        **_tables(totals, steps, on_gpu, top_k, step_ranges),
        "steps": steps,
        "work_time_s": sum(work_per_step.values()) / steps,
        "work_fraction": statistics.median(fractions) if fractions else 0.0,
        "median_op_time_s": statistics.median(totals.op_times) if totals.op_times else 0.0,
        "small_op_s": small_op_s,
        "sync_wait_s": totals.sync_wait / steps if on_gpu else None,
    }


def _tables(
    t: _Totals, n: int, on_gpu: bool, top_k: int, step_ranges: list[tuple[int, int]]
) -> dict[str, Any]:
    primary = 1 if on_gpu else 0
    total = sum(v[primary] for v in t.ops.values()) or 1.0
    ranked = sorted(t.ops.items(), key=lambda kv: -kv[1][primary])
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
    for (_, category), values in t.ops.items():
        by_category[category] += values[primary]
    categories = [
        CategoryTime(category=c, self_time_s=s / n, share=s / total)  # type: ignore[arg-type]
        for c, s in sorted(by_category.items(), key=lambda kv: -kv[1])
    ]
    if on_gpu:  # the step's range, which ends with the sync that waits for the kernels
        step_host = sum((end - begin) * 1e-9 for begin, end in step_ranges) / n
    else:  # the phases, leaving out the tiny-op yardstick run after each step
        step_host = sum(t.phase_cpu.get(p, 0.0) for p in PHASES) / n
    phases = [
        PhaseTime(
            phase=p,  # type: ignore[arg-type]
            cpu_time_s=t.phase_cpu[p] / n,
            device_time_s=t.phase_dev[p] / n if on_gpu else None,
            share=(t.phase_cpu[p] / n) / step_host if step_host else 0.0,
        )
        for p in PHASES
        if p in t.phase_cpu
    ]
    return {
        "top_ops": top_ops,
        "categories": categories,
        "phases": phases,
        "module_times": {
            k: (t.module_cpu[k] / n, t.module_dev[k] / n if on_gpu else None) for k in t.module_cpu
        },
    }


def _tiny_ops() -> None:
    """A yardstick for 'small': one-element adds, profiled right next to the user's ops."""
    a, b = torch.ones(1), torch.ones(1)
    with record_function(CALIBRATION):
        for _ in range(TINY_OPS_PER_STEP):
            torch.add(a, b)


def profiled_pass(
    runner: StepRunner,
    *,
    warmup: int,
    active: int,
    small_op_s: float,
    top_k: int,
    trace_path: Path | None,
) -> TraceSummary:
    """Run warmup + active steps under torch.profiler; time the active ones; summarize their events.

    `warmup=0` is allowed (profile_model's CPU pass: the model is warm, and a CPU profiler needs no
    settling step); torch's warning that a schedule without warm-up can skew results is then not
    shown.
    """
    on_gpu = runner.device.type == "cuda"
    sync = synchronizer(runner.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    times: list[float] = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
        steps = schedule(wait=0, warmup=warmup, active=active, repeat=1)
    with (
        _ModuleMarkers(runner.model),
        profile(activities=activities, schedule=steps) as prof,
    ):
        for index in range(warmup + active):
            sync()
            start = time.perf_counter()
            runner.checked_step(_phase_marker)
            sync()
            if index >= warmup:
                times.append(time.perf_counter() - start)
            if not on_gpu:
                _tiny_ops()
            prof.step()
    events = raw_events(prof)
    written = None
    if trace_path is not None:
        write_trace(prof, Path(trace_path))
        written = str(trace_path)
    summary = summarize_events(events, on_gpu=on_gpu, small_op_s=small_op_s, top_k=top_k)
    return TraceSummary(step_times_s=times, trace_path=written, **summary)


def write_trace(prof, path: Path) -> None:
    """Export the Chrome trace to `path` without ever replacing a file there (a file that appeared
    since the request was checked makes this raise FileExistsError)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    prof.export_chrome_trace(str(tmp))
    try:
        os.link(tmp, path)  # fails if `path` exists: no overwrite, even in a race
    except FileExistsError:
        from torch_skills.runner.errors import UserCodeError

        raise UserCodeError(
            "bad_request",
            f"trace_path {path} appeared while profiling and is never overwritten; pick another name",
        ) from None
    finally:
        os.unlink(tmp)

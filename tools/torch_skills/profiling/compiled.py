"""torch.compile(model) against eager: compile time, step time, speed-up, graph breaks.

Use `compare_compiled(runner, eager_median_s, warmup=3, active=10)` -> `CompileReport`. The first
compiled step is timed on its own (it includes compilation); then warm-up steps absorb
recompilations, and the active steps give the median. A failure to compile (no C++ compiler, an
unsupported op, a backend error) becomes `status="failed"` with the error, never a crash of the
profile. Inductor is asked to compile on one thread: the tool must not take over a shared machine.

Known limitations: the optimizer step stays eager (only the model is compiled); graph-break reasons
are the ones torch._dynamo counts, which are summaries, not source locations.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo

from torch_skills.profiling.calibrate import synchronizer
from torch_skills.profiling.models import CompileReport
from torch_skills.profiling.stats import summarize
from torch_skills.profiling.step import StepRunner

MAX_ERROR_CHARS = 1200


def _graph_breaks() -> tuple[int, list[str]]:
    from torch._dynamo.utils import counters

    breaks = counters.get("graph_break", {})
    return int(sum(breaks.values())), [str(reason)[:300] for reason in list(breaks)[:10]]


def compare_compiled(
    runner: StepRunner,
    eager_median_s: float,
    *,
    warmup: int,
    active: int,
    compiler: Callable[[torch.nn.Module], Any] = torch.compile,
) -> CompileReport:
    """Time the step with `compiler(model)` (torch.compile); report against the eager median."""
    sync = synchronizer(runner.device)
    import torch._inductor.config as inductor_config

    try:
        with inductor_config.patch(compile_threads=1):  # restored on exit
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            compiled = runner.with_model(compiler(runner.model))
            sync()
            start = time.perf_counter()
            compiled.step()
            sync()
            compile_time = time.perf_counter() - start
            for _ in range(max(warmup - 1, 0)):
                compiled.step()
            times = []
            for _ in range(active):
                sync()
                start = time.perf_counter()
                compiled.step()
                sync()
                times.append(time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - any compiler failure is a finding, not a crash
        text = f"{type(exc).__name__}: {exc}".strip()
        return CompileReport(status="failed", error=text[:MAX_ERROR_CHARS])
    stats = summarize(times)
    breaks, reasons = _graph_breaks()
    return CompileReport(
        status="ok",
        compile_time_s=compile_time,
        step_time_s=stats.median,
        step_time_iqr_s=stats.iqr,
        speedup=eager_median_s / stats.median if stats.median > 0 else None,
        graph_breaks=breaks,
        graph_break_reasons=reasons,
    )

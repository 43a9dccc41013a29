"""Time steps without the profiler: perf_counter around each step, CUDA synchronized on both sides.

Use `timed = time_steps(runner, warmup=3, active=10, budget_s=5.0)`; `timed.times_s` are the active steps' wall
times, `timed.waits_s` the part of each spent in next(loader), `timed.samples` the batch size of
each. Warm-up steps run first and are not recorded (first calls allocate, pick kernels, fill caches).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from torch_skills.profiling.calibrate import synchronizer
from torch_skills.profiling.step import StepRunner


@dataclass(frozen=True)
class TimedSteps:
    times_s: list[float]
    waits_s: list[float]
    samples: list[int | None]

    @property
    def data_wait_share(self) -> float:
        """Time in next(loader) over all active steps / their total time."""
        total = sum(self.times_s)
        return sum(self.waits_s) / total if total > 0 else 0.0

    @property
    def throughput(self) -> float | None:
        """Samples per second over the active steps, when every batch has a leading size."""
        if not self.samples or any(n is None for n in self.samples):
            return None
        total = sum(self.times_s)
        return sum(n for n in self.samples if n is not None) / total if total > 0 else None


MIN_TIMED_STEPS = 3  # a median, a spread and an IQR need three


MIN_WARMUP_STEPS = 2  # the first step pays one-time costs; the second runs with the optimizer state made


def time_steps(
    runner: StepRunner,
    *,
    warmup: int,
    active: int,
    budget_s: float | None = None,
    warmup_budget_s: float | None = None,
    prior_steps: int = 0,
    prior_s: float = 0.0,
) -> TimedSteps:
    """Run warmup + active steps; return the active ones' times, loader waits and batch sizes.

    With `budget_s`, timing stops early once the timed steps total that many seconds and at least
    MIN_TIMED_STEPS ran: a step that long has a stable median, and more repeats only cost time.
    With `warmup_budget_s`, the warm-up likewise stops after MIN_WARMUP_STEPS once it took that long;
    `prior_steps` warm-up steps that took `prior_s` already ran (profile_model's probe step) and count."""
    sync = synchronizer(runner.device)
    started = time.perf_counter() - prior_s
    for index in range(warmup):
        warmed_up = index + prior_steps >= MIN_WARMUP_STEPS
        if warmed_up and warmup_budget_s is not None and time.perf_counter() - started >= warmup_budget_s:
            break
        runner.checked_step()
        sync()
    times, waits, samples = [], [], []
    for _ in range(active):
        start = time.perf_counter()
        waited = runner.checked_step()
        sync()
        times.append(time.perf_counter() - start)
        waits.append(waited)
        samples.append(runner.source.last_samples)
        if budget_s is not None and len(times) >= MIN_TIMED_STEPS and sum(times) >= budget_s:
            break
    return TimedSteps(times, waits, samples)

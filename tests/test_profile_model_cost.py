"""profile_model's cost: how many times it runs the user's step, and fewer repeats for long steps."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from torch_skills.profiling import worker
from torch_skills.profiling.models import ProfileRequest
from torch_skills.profiling.probe import probe_step
from torch_skills.profiling.step import StepRunner, build_step
from torch_skills.profiling.timing import MIN_TIMED_STEPS, time_steps
from torch_skills.runner.child import JobContext

REPO = Path(__file__).resolve().parents[1]
SCENARIO_MODELS = REPO / "evals" / "models" / "profile_model_scenarios.py"


@pytest.fixture
def job(tmp_path: Path) -> JobContext:
    return JobContext(tmp_path, "cpu", [str(REPO)], str(REPO))


@pytest.fixture
def steps_run(monkeypatch) -> list[int]:
    """Counts every run of the user's step (StepRunner.checked_step), whoever calls it."""
    calls: list[int] = []
    original = StepRunner.checked_step

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(StepRunner, "checked_step", counted)
    return calls


def _profile(job, **kwargs):
    request = ProfileRequest(
        model=f"{SCENARIO_MODELS}:flops_mlp", input_shape=[32, 64], cpu_threads=1, **kwargs
    )
    return worker.run(request, job)


def test_the_flop_probe_is_the_first_warm_up_step_not_an_extra_one(job, steps_run):
    """A short step on a CPU runs the probed first step (the warm-up), active timed and active profiled
    steps: no other, and no profiler warm-up step."""
    result = _profile(job, warmup_steps=1, active_steps=4)
    assert len(steps_run) == 1 + 4 + 4
    assert result.flops_per_step > 0 and result.probe_error is None
    assert len(result.timing.times_s) == 4
    assert result.ops_per_step > 0 and result.top_ops


def test_a_long_step_is_profiled_fewer_times(job, steps_run, monkeypatch):
    """When the timed steps are long next to the profiling budget, two profiled steps are run."""
    monkeypatch.setattr(worker, "PROFILE_BUDGET_S", 1e-9)
    result = _profile(job, warmup_steps=1, active_steps=5)
    assert len(steps_run) == 1 + 5 + worker.MIN_PROFILED_STEPS
    assert result.profiled_step_time_s > 0 and result.phases


@pytest.mark.parametrize(
    ("active", "step_s", "expected"),
    [(10, 0.001, 10), (10, 0.5, 3), (10, 4.0, 2), (3, 4.0, 2), (3, 0.1, 3), (10, 0.0, 10)],
)
def test_the_profiled_steps_shrink_with_the_step_time(active, step_s, expected):
    """About PROFILE_BUDGET_S (1.5 s) of profiled steps, never over active_steps nor under two."""
    assert worker.profiled_steps(active, step_s) == expected


class _SleepyRunner:
    """Stands in for a StepRunner whose every step takes `step_s`."""

    def __init__(self, step_s: float):
        self.step_s = step_s
        self.device = torch.device("cpu")
        self.source = SimpleNamespace(last_samples=8)
        self.steps = 0

    def checked_step(self, *_args) -> float:
        self.steps += 1
        time.sleep(self.step_s)
        return 0.0


def test_timing_stops_once_the_budget_is_spent_but_not_before_three_steps():
    """Steps of 20 ms with a 10 ms budget: three timed, not the ten asked for."""
    runner = _SleepyRunner(0.02)
    timed = time_steps(runner, warmup=1, active=10, budget_s=0.01)
    assert len(timed.times_s) == MIN_TIMED_STEPS
    assert runner.steps == 1 + MIN_TIMED_STEPS


def test_short_steps_are_all_timed_within_the_budget():
    """Steps far below the budget run every active step asked for."""
    runner = _SleepyRunner(0.001)
    timed = time_steps(runner, warmup=1, active=6, budget_s=10.0)
    assert len(timed.times_s) == 6


def test_a_long_warm_up_stops_after_two_steps():
    """Warm-up steps of 20 ms with a 10 ms warm-up budget: two run, not the five asked for."""
    runner = _SleepyRunner(0.02)
    timed = time_steps(runner, warmup=5, active=3, warmup_budget_s=0.01)
    assert runner.steps == 2 + 3 and len(timed.times_s) == 3


def test_a_warm_up_step_that_already_ran_counts_towards_the_warm_up_budget():
    """The probe's first step took the whole budget: one more warm-up step runs (two in all), not four."""
    runner = _SleepyRunner(0.02)
    time_steps(runner, warmup=4, active=3, warmup_budget_s=0.01, prior_steps=1, prior_s=0.02)
    assert runner.steps == 1 + 3


def test_the_first_step_probe_counts_what_a_later_step_does(job):
    """The optimizer making its state in the first step (AdamW's zeroed moments) is not in the counts:
    a probe over the first step gives a later step's FLOPs, bytes and ops."""
    request = ProfileRequest(
        model=f"{SCENARIO_MODELS}:flops_mlp", input_shape=[32, 64], cpu_threads=1, optimizer="adamw"
    )
    runner = build_step(request, job, torch.device("cpu"))
    first = probe_step(runner, first_step=True)
    later = probe_step(runner)
    assert (first.flops, first.bytes_moved, first.ops) == (later.flops, later.bytes_moved, later.ops)
    assert first.bytes_moved > 0


def test_a_warm_up_within_its_budget_runs_every_step_asked_for():
    """Short warm-up steps all run."""
    runner = _SleepyRunner(0.001)
    time_steps(runner, warmup=4, active=3, warmup_budget_s=10.0)
    assert runner.steps == 4 + 3

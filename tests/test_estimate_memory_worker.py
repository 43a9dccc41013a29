"""estimate_memory's per-rank math, batch-size search, fallback and findings, called in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.fixtures import memory_models as zoo
from torch_skills.memory.estimate import Target, estimate_trace
from torch_skills.memory.groundtruth import measure_real_step
from torch_skills.memory.models import EstimateMemoryRequest
from torch_skills.memory.search import max_batch_size
from torch_skills.memory.trace import StepSpec, trace_step
from torch_skills.runner.child import JobContext
from torch_skills.runner.errors import UserCodeError
from torch_skills.runner.usercode import default_loss

REPO = Path(__file__).resolve().parents[1]
MODELS = "tests/fixtures/memory_models.py"
P = 4096 * 4096 + 4096  # parameters of nn.Linear(4096, 4096)


def mean_loss(output, batch):
    return default_loss(output)


@pytest.fixture(scope="module")
def linear_trace():
    return trace_step(
        lambda: torch.nn.Linear(4096, 4096),
        lambda b: torch.randn(1, 4096),
        mean_loss,
        StepSpec(optimizer="adam"),
    )


@pytest.fixture
def job(tmp_path):
    return JobContext(tmp_path, "cpu", [str(REPO)], str(REPO))


def run(job, **fields):
    from torch_skills.memory.worker import run as run_tool

    return run_tool(EstimateMemoryRequest(**fields), job)


def test_zero1_keeps_a_quarter_of_the_optimizer_state_on_each_of_four_ranks(linear_trace):
    """zero1 over 4 ranks: Adam's moments / 4 (each 4-byte step counter rounds up to 1 byte); the rest unchanged."""
    one = estimate_trace(linear_trace, Target(cuda=False))
    four = estimate_trace(linear_trace, Target(cuda=False, sharding="zero1", world_size=4))
    assert four.breakdown["optimizer_state"] == 2 * P * 4 // 4 + 2
    assert four.breakdown["parameters"] == one.breakdown["parameters"] == P * 4
    assert four.peak_allocated < one.peak_allocated


def test_ddp_adds_gradient_buckets_as_large_as_the_gradients(linear_trace):
    """DDP (gradient_as_bucket_view=False): the peak in optimizer.step holds the gradients twice."""
    ddp = estimate_trace(linear_trace, Target(cuda=False, sharding="ddp", world_size=8))
    assert ddp.phase == "optimizer_step"
    assert ddp.breakdown["gradients"] == 2 * P * 4
    assert any("gradient_as_bucket_view=True" in a for a in ddp.assumptions)


def test_fsdp_shards_parameters_and_gathers_two_units_in_forward():
    """Inference under FSDP over 4 ranks: each Linear unit / 4, plus two whole units gathered (running + prefetched)."""
    build = lambda: torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(3)))  # noqa: E731
    trace = trace_step(build, lambda b: torch.randn(8, 1024), mean_loss, StepSpec(mode="inference"))
    unit = (1024 * 1024 + 1024) * 4
    assert trace.fsdp_units == {"0": unit, "1": unit, "2": unit}
    est = estimate_trace(trace, Target(cuda=False, sharding="fsdp", world_size=4, training=False))
    assert est.breakdown["parameters"] == 3 * (1024 * 1024 // 4 + 1024 // 4) * 4 + 2 * unit


def test_the_batch_search_returns_a_size_that_fits_with_the_next_one_failing():
    """With 40 MiB for an MLP trained with SGD the search's answer fits and one more sample does not."""
    target = Target(cuda=False, capacity_bytes=40 * 2**20)
    spec = StepSpec(optimizer="sgd")

    def at(batch):
        return estimate_trace(
            trace_step(zoo.build_mlp, zoo.mlp_inputs, mean_loss, spec, batch_size=batch), target
        )

    found = max_batch_size(at, at(64), capacity_bytes=target.capacity_bytes)
    assert found.batch_size and found.batch_size > 64
    assert at(found.batch_size).fits and not at(found.batch_size + 1).fits
    assert "linear" in found.method and len(found.traced) <= 9


def test_data_dependent_forward_falls_back_to_extrapolating_real_runs(job):
    """A forward calling .item() cannot be traced: real runs at batch 2 and 3 are extrapolated to 64, within 3% of a real run."""
    result = run(
        job,
        model=f"{MODELS}:build_data_dependent",
        inputs=f"{MODELS}:small_inputs",
        batch_size=64,
        target_device="cpu",
        optimizer="adam",
    )
    assert result.method == "extrapolated"
    assert "trace_failed_extrapolated" in [f.code for f in result.findings]
    truth = measure_real_step(
        zoo.build_data_dependent,
        zoo.small_inputs,
        mean_loss,
        StepSpec(optimizer="adam"),
        batch_size=64,
        steps=2,
    )
    assert result.peak_allocated_bytes == pytest.approx(truth.peak_allocated_bytes, rel=0.03)


def test_gradient_accumulation_keeps_gradients_alive_in_the_next_forward(job):
    """With 4 micro-batches the second forward runs with all gradients alive; the finding says by how much."""
    common = dict(
        model=f"{MODELS}:build_mlp", inputs=f"{MODELS}:mlp_inputs", target_device="cpu", optimizer="sgd"
    )
    single = run(job, **common)
    accumulated = run(job, gradient_accumulation=4, **common)
    finding = next(f for f in accumulated.findings if f.code == "gradient_accumulation")
    assert accumulated.peak_allocated_bytes > single.peak_allocated_bytes
    assert finding.skill == "tensor-operations-and-memory"


@pytest.mark.slow  # over 2 s under load: the README's quick set stays near 5 minutes
def test_a_step_that_does_not_fit_is_an_error_finding_with_the_largest_batch_that_does(job):
    """GPT in 0.92 GiB on CUDA (257 MiB beside the 685 MiB context): fits is False, does_not_fit names the skill, max_batch_size is smaller than asked."""
    result = run(
        job,
        model=f"{MODELS}:build_gpt",
        inputs=f"{MODELS}:gpt_inputs",
        loss=f"{MODELS}:next_token_loss",
        batch_size=32,
        device_memory_gib=0.92,
    )
    assert result.fits is False and result.headroom_bytes < 0
    assert result.max_batch_size is not None and 0 < result.max_batch_size < 32
    finding = next(f for f in result.findings if f.code == "does_not_fit")
    assert finding.severity == "error" and finding.skill == "tensor-operations-and-memory"
    assert result.peak_device_bytes == result.peak_reserved_bytes + result.cuda_context_bytes


def test_an_unknown_checkpointing_class_is_a_bad_request_naming_the_classes(job):
    """activation_checkpointing=['Nope'] fails before any tracing with the model's module classes listed."""
    with pytest.raises(UserCodeError) as err:
        run(
            job, model=f"{MODELS}:build_gpt", inputs=f"{MODELS}:gpt_inputs", activation_checkpointing=["Nope"]
        )
    assert err.value.kind == "bad_request" and "GPTBlock" in err.value.message

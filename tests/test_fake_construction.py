"""Fake-tensor tracing survives real constructors, and a fallback names its real cause."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torch_skills.memory import worker as memory_worker
from torch_skills.memory.construct import fake_safe_construction, fakeify_real_tensors
from torch_skills.memory.models import EstimateMemoryRequest
from torch_skills.memory.trace import fake_mode
from torch_skills.runner.child import JobContext
from torch_skills.runner.errors import UserCodeError

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "tests" / "fixtures" / "constructor_models.py"


@pytest.fixture
def job(tmp_path: Path) -> JobContext:
    return JobContext(tmp_path, "cpu", [str(REPO)], str(REPO))


def _estimate(job, model: str, **kwargs):
    request = EstimateMemoryRequest(model=f"{MODELS}:{model}", input_shape=[8, 32], device="cpu", **kwargs)
    return memory_worker.run(request, job)


def test_small_constants_are_real_and_parameters_end_up_fake():
    """linspace(...).item() works inside the guard; afterwards every parameter is fake, ties kept."""
    from torch._subclasses.fake_tensor import FakeTensor

    from tests.fixtures.constructor_models import DropPathStack

    mode = fake_mode()
    with mode, fake_safe_construction():
        model = DropPathStack()
        model.tied = nn_tied = model.blocks[0]
        nn_tied.weight = model.blocks[1].weight
    fakeify_real_tensors(model, mode)
    assert model.rates == pytest.approx([0.0, 0.1 / 3, 0.2 / 3, 0.1])
    assert all(isinstance(p, FakeTensor) for p in model.parameters())
    assert model.blocks[0].weight is model.blocks[1].weight


def test_the_guard_restores_trunc_normal_and_real_init_is_unchanged():
    """Outside the block torch's own trunc_normal_ runs again, with its bounds honoured."""
    original = torch.nn.init._no_grad_trunc_normal_
    with fake_safe_construction():
        assert torch.nn.init._no_grad_trunc_normal_ is not original
        t = torch.nn.init.trunc_normal_(torch.empty(1000), std=1.0, a=-0.5, b=0.5)  # real: torch's own
    assert torch.nn.init._no_grad_trunc_normal_ is original
    assert float(t.abs().max()) <= 0.5


def test_a_fake_build_leaves_the_random_generator_as_it_was():
    """Small factories run for real draw random numbers; the guard puts the generator back."""
    from tests.fixtures.constructor_models import DropPathStack

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with fake_mode(), fake_safe_construction():
        DropPathStack()
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("model", ["drop_path_stack", "trunc_init"])
def test_constructors_that_read_small_tensors_or_use_trunc_normal_are_traced(job, model):
    """timm-style drop-path rates and ViT-style trunc_normal_ init: traced, no fallback finding."""
    result = _estimate(job, model)
    assert result.method == "traced"
    assert "trace_failed_extrapolated" not in [f.code for f in result.findings]


def test_a_value_read_in_forward_falls_back_and_names_forward_and_the_line(job):
    """The fallback message names the step, the user's line, and says to move it out of forward."""
    result = _estimate(job, "reads_in_forward")
    assert result.method != "traced"
    finding = next(f for f in result.findings if f.code == "trace_failed_extrapolated")
    assert "the step" in finding.message and "constructor_models.py:" in finding.message
    assert "reads a tensor's value" in finding.message and "out of forward" in finding.message


def test_a_constructor_reading_a_large_tensor_is_named_as_the_factory(job):
    """A constructor that reads a large tensor's value: the message blames the factory, not forward."""
    result = _estimate(job, "reads_large_in_init")
    finding = next(f for f in result.findings if f.code == "trace_failed_extrapolated")
    assert finding.message.count("the model factory") == 1 and "out of forward" not in finding.message
    assert "constructor_models.py:" in finding.message


def test_the_room_check_runs_before_a_real_step_even_for_guarded_constructors(job, monkeypatch):
    """With no room, the fallback is refused before any real step: the model was sized on fake tensors."""
    monkeypatch.setattr(memory_worker, "_memory_room_bytes", lambda: 1 << 20)
    with pytest.raises(UserCodeError, match="too large to measure for real"):
        _estimate(job, "reads_in_forward")

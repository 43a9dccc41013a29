"""Zero gradients by design (zero-initialized gains) are recognised; a real dead path is still found."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from torch_skills.gradients.models import GradientRequest
from torch_skills.gradients.worker import run
from torch_skills.runner.child import JobContext

ZOO = FIXTURES / "gradient_zoo.py"


@pytest.fixture
def job(tmp_path: Path) -> JobContext:
    return JobContext(tmp_path, "cpu", [str(FIXTURES)], str(tmp_path))


def test_a_zero_init_residual_model_has_no_zero_gradient_finding(job):
    """The branch behind each zero BatchNorm gain is flagged zero_init_gated, not zero_grad, and nothing is found."""
    result = run(GradientRequest(model=f"{ZOO}:zero_init_residual", input_shape=[8, 16], device="cpu"), job)
    assert [f.code for f in result.findings] == []
    gated = set(result.zero_init_gated)
    assert {"1.fc1.weight", "1.bn1.weight", "1.bn1.bias", "1.fc2.weight", "2.fc1.weight"} <= gated
    assert not any("zero_grad" in p.flags for p in result.parameters)


def test_the_probe_step_leaves_the_models_weights_and_grads_as_they_were(job):
    """The reported norms are those of the untouched model: the zero gains are still exactly zero."""
    result = run(GradientRequest(model=f"{ZOO}:zero_init_residual", input_shape=[8, 16], device="cpu"), job)
    by_name = {p.name: p for p in result.parameters}
    assert by_name["1.bn2.weight"].param_norm == 0 and by_name["1.bn2.weight"].grad_norm > 0
    assert by_name["1.fc1.weight"].grad_norm == 0


def test_a_constant_zero_multiplier_is_still_a_zero_gradient_finding(job):
    """No zero-valued gain gates `fc`: its zero gradient stays a warning."""
    result = run(GradientRequest(model=f"{ZOO}:zero_multiplier", input_shape=[8, 16], device="cpu"), job)
    assert "zero_gradients" in [f.code for f in result.findings]
    assert result.zero_init_gated == []

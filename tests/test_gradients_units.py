"""The pieces of check_gradients against ground truth: norms, dead units, the op tracer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from torch_skills.gradients import analysis
from torch_skills.gradients.models import GradientThresholds
from torch_skills.gradients.probe import ForwardProbe
from torch_skills.gradients.trace import BackwardWatch, OpTracer


def test_gradient_norms_match_torch():
    """Per-parameter norms equal .grad.norm() and the total equals what clip_grad_norm_ measures."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    model(torch.randn(4, 5)).pow(2).mean().backward()
    params = analysis.parameter_gradients(model, GradientThresholds())
    for stat, (name, p) in zip(params, model.named_parameters(), strict=True):
        assert stat.name == name
        assert stat.grad_norm == pytest.approx(float(p.grad.norm()), rel=1e-6)
        assert stat.param_norm == pytest.approx(float(p.detach().norm()), rel=1e-6)
        assert stat.ratio == pytest.approx(stat.grad_norm / stat.param_norm)
    total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=float("inf"))
    assert analysis.total_grad_norm(params) == pytest.approx(float(total), rel=1e-6)


def test_a_float16_gradient_norm_does_not_overflow_while_measured():
    """Norms are taken in float64: a float16 grad of 300s in 1000 entries has norm ~9487, above fp16's sum range."""
    p = nn.Parameter(torch.zeros(1000, dtype=torch.float16))
    p.grad = torch.full((1000,), 300.0, dtype=torch.float16)
    (stat,) = analysis.parameter_gradients(nn.ParameterList([p]), GradientThresholds())
    assert stat.grad_norm == pytest.approx(300.0 * 1000**0.5, rel=1e-3)
    assert "nonfinite_grad" not in stat.flags


def test_dead_unit_fraction_counts_positions_zero_for_every_sample():
    """Half the columns negative for every sample: zero_fraction and dead_unit_fraction are both 1/2."""
    model = nn.Sequential(nn.Identity(), nn.ReLU())
    x = torch.rand(6, 10) + 0.1  # (B, C) positive
    x[:, :5] *= -1  # columns 0..4 negative for every sample
    with ForwardProbe(model) as probe:
        model(x)
    (stats,) = probe.activation_stats()
    assert stats.module == "1"
    assert stats.zero_fraction == pytest.approx(0.5)
    assert stats.dead_unit_fraction == pytest.approx(0.5)
    assert model[1]._forward_hooks == {}  # hooks are gone after the probe


def test_a_batch_of_one_has_no_dead_unit_figure():
    """With one sample, 'zero for every sample' means nothing, so dead_unit_fraction is None."""
    model = nn.ReLU()
    with ForwardProbe(model) as probe:
        model(torch.randn(1, 8))
    (stats,) = probe.activation_stats()
    assert stats.dead_unit_fraction is None


class MaskThenLog(nn.Module):
    """Attention-style -inf mask that softmax absorbs, then a real log(0) later."""

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        mask = torch.triu(torch.ones_like(scores, dtype=torch.bool), diagonal=1)
        weights = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)  # finite again
        return torch.log(weights - weights)  # log(0) = -inf: the real bug


def test_a_minus_inf_mask_absorbed_by_softmax_is_not_blamed(tmp_path: Path):
    """The tracer follows the output's NaN back to log, though masked_fill made the first -inf."""
    model = MaskThenLog()
    tracer = OpTracer(model, tmp_path, watch_values=True, watch_cuts=False, watch_nodes=False)
    with tracer:
        out = model(torch.randn(4, 4))
    assert tracer.first_created is not None and tracer.first_created.op == "masked_fill"
    where = tracer.origin_of(out)
    assert where is not None and where.op == "log" and where.inputs_finite is True


class InplaceLog(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x).relu()
        return h.log_()  # in place: the output tensor is the input tensor


def test_an_inplace_op_that_creates_inf_is_found(tmp_path: Path):
    """An in-place log_ is blamed even though its output and input are the same tensor."""
    model = InplaceLog()
    with torch.no_grad():
        model.inner.bias.fill_(-100.0)  # every unit zero after the ReLU
    tracer = OpTracer(model, tmp_path, watch_values=True, watch_cuts=False, watch_nodes=False)
    with tracer, torch.no_grad():
        out = model(torch.randn(2, 3))
    where = tracer.origin_of(out)
    assert where is not None and (where.op, where.module, where.inputs_finite) == ("log_", "", True)


def test_the_backward_watch_names_the_node_and_removes_its_hooks(tmp_path: Path):
    """norm-by-sqrt at zero: the watch stops at SqrtBackward0 and the graph has no hooks left."""
    model = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        model.weight.zero_()  # output exactly zero
    tracer = OpTracer(model, tmp_path, watch_values=False, watch_cuts=False, watch_nodes=True)
    with tracer:
        out = model(torch.randn(2, 3))
        loss = torch.sqrt((out * out).sum())
    with BackwardWatch(loss, tracer) as watch:
        loss.backward()
    assert watch.location is not None
    assert (watch.location.autograd_node, watch.location.inputs_finite) == ("SqrtBackward0", True)
    assert watch.location.module is None  # the sqrt ran outside the model
    assert model._forward_hooks == {} and model._forward_pre_hooks == {}

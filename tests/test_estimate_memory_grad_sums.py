"""The autograd engine's gradient sums: in place in a real step, and so in the estimate."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torch_skills.memory.estimate import Target, estimate_trace
from torch_skills.memory.groundtruth import measure_real_step
from torch_skills.memory.trace import StepSpec, trace_step
from torch_skills.runner.usercode import default_loss


class SliceScan(nn.Module):
    """A recurrence over the time steps of one projected tensor, as Mamba's pure-torch selective scan.

    Every `h[:, t]` sends back a gradient the size of all of `h` (select_backward), which the engine
    sums into one buffer: in place without a dispatch mode, out of place under one.
    """

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, 8)
        h = self.proj(x)  # (B, T, 256)
        state = torch.zeros_like(h[:, 0])  # (B, 256)
        for t in range(h.shape[1]):
            state = state * 0.9 + h[:, t]
        return state


def scan_inputs(batch_size: int | None = None) -> torch.Tensor:
    return torch.randn(batch_size or 4, 16, 8)  # (B, T, 8)


def mean_loss(output, batch):
    return default_loss(output)


def test_a_scan_over_slices_of_one_tensor_is_estimated_as_the_real_step_measures():
    """Summing each slice's full-size gradient in place, as the real engine does, brings the estimate to the measured peak."""
    spec = StepSpec(mode="train", optimizer="adamw", foreach=False)
    trace = trace_step(SliceScan, scan_inputs, mean_loss, spec)
    estimate = estimate_trace(trace, Target(cuda=False)).peak_allocated
    truth = measure_real_step(SliceScan, scan_inputs, mean_loss, spec, batch_size=None).peak_allocated_bytes
    assert estimate == pytest.approx(truth, rel=0.005)


class DoubleBack(torch.autograd.Function):
    """Identity forward; a backward whose own `add` frees its first operand at once (not an engine sum)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * 2 + grad  # the temporary `grad * 2` dies as the add returns, as for real


class OwnBackward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 4096)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, 8)
        return DoubleBack.apply(self.proj(x))  # (B, T, 4096)


def test_an_add_inside_a_node_of_the_backward_stays_out_of_place():
    """Only the engine's sums between nodes are in place: an add in a node's own backward is counted as it allocates."""
    spec = StepSpec(mode="train", optimizer="adamw", foreach=False)
    trace = trace_step(OwnBackward, scan_inputs, mean_loss, spec)
    estimate = estimate_trace(trace, Target(cuda=False)).peak_allocated
    truth = measure_real_step(OwnBackward, scan_inputs, mean_loss, spec, batch_size=None).peak_allocated_bytes
    assert estimate == pytest.approx(truth, rel=0.005)

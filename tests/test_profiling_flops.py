"""Convolution FLOPs, forward and backward, against the analytic count (grouped and depthwise included)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torch_skills.profiling.flops import flop_counter


def _step_flops(conv: nn.Module, x: torch.Tensor) -> int:
    counter = flop_counter()
    with counter:
        conv(x).sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize(
    ("c_in", "c_out", "groups"),
    [(16, 32, 1), (16, 32, 4), (32, 32, 32)],  # dense, grouped, depthwise
)
@pytest.mark.parametrize("input_grad", [False, True])
def test_conv_training_flops_match_the_analytic_count(c_in, c_out, groups, input_grad):
    """fwd = 2*N*H_out*W_out*C_out*(C_in/groups)*k*k; grad_weight = fwd; grad_input = fwd when the input needs it."""
    n, h, w, k = 2, 10, 10, 3
    conv = nn.Conv2d(c_in, c_out, k, padding=1, groups=groups, bias=False)
    x = torch.randn(n, c_in, h, w, requires_grad=input_grad)
    forward = 2 * n * h * w * c_out * (c_in // groups) * k * k
    assert _step_flops(conv, x) == forward * (3 if input_grad else 2)


def test_a_transposed_grouped_conv_is_counted_like_its_forward():
    """ConvTranspose2d with groups: each gradient costs one forward, as the forward formula counts it."""
    n, c_in, c_out, groups, k = 2, 8, 16, 2, 3
    conv = nn.ConvTranspose2d(c_in, c_out, k, groups=groups, bias=False)
    x = torch.randn(n, c_in, 5, 5, requires_grad=True)
    forward = 2 * n * 5 * 5 * c_in * (c_out // groups) * k * k  # each input position meets the whole kernel
    assert _step_flops(conv, x) == 3 * forward

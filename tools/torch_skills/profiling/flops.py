"""FLOP counting for the profiled step: torch's FlopCounterMode with a corrected convolution backward.

Use `counter = flop_counter()` where `FlopCounterMode(display=False)` would go.

torch's formula for `aten.convolution_backward` (torch/utils/flop_counter.py) computes the
weight gradient as a convolution of the input with the output gradient over *all* input
channels, ignoring `groups`: a grouped convolution's weight gradient is counted `groups` times
too large, a depthwise one (groups = channels, ConvNeXt, MobileNet, EfficientNet) by its channel
count. Here each gradient costs what the forward convolution costs, which is the analytic count:

    forward      = 2 * N * prod(out_spatial) * C_out * (C_in / groups) * prod(kernel)
    grad_input   = forward   (a transposed convolution of grad_out with the same weight)
    grad_weight  = forward   (each weight element meets the same input/grad_out pairs)

where the weight's shape already carries `C_in / groups`. Transposed convolutions swap the
roles of input and output spatial sizes, as the forward formula does.

Known limitations: multiply-adds count as 2 FLOPs and bias gradients are not counted, as in
torch's own formulas.
"""

from __future__ import annotations

from math import prod

import torch
from torch.utils.flop_counter import FlopCounterMode


def conv_forward_flops(x_shape, w_shape, out_shape, transposed: bool) -> int:
    """2 * N * prod(conv spatial) * w_shape[0] * w_shape[1] * prod(kernel); w_shape[1] is already per group."""
    conv_spatial = (x_shape if transposed else out_shape)[2:]
    return 2 * x_shape[0] * prod(conv_spatial) * w_shape[0] * w_shape[1] * prod(w_shape[2:])


def conv_backward_flops(
    grad_out_shape,
    x_shape,
    w_shape,
    _bias,
    _stride,
    _padding,
    _dilation,
    transposed,
    _output_padding,
    _groups,
    output_mask,
    out_shape=None,
    **_kwargs,
) -> int:
    """FLOPs of aten.convolution_backward: one forward's worth per gradient asked for (see module docstring)."""
    forward = conv_forward_flops(list(x_shape), list(w_shape), list(grad_out_shape), bool(transposed))
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def flop_counter() -> FlopCounterMode:
    """A FlopCounterMode (no display) with the corrected convolution backward."""
    return FlopCounterMode(
        display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flops}
    )

"""FLOP counting for the profiled step: torch's FlopCounterMode, with a corrected convolution backward
and formulas for the ops it has none for: fused RNN layers and grouped matmuls (MoE experts).

Use `counter = flop_counter()` where `FlopCounterMode(display=False)` would go.

Convolution backward.
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

Fused RNN layers. On a CPU, nn.LSTM in float32/bfloat16 runs each layer and direction as one
`aten.mkldnn_rnn_layer` (backward `mkldnn_rnn_layer_backward`); on a GPU nn.LSTM/GRU/RNN run as one
`aten._cudnn_rnn` (backward `_cudnn_rnn_backward`). torch counts none of them, so an LSTM step
counted 0 FLOPs. Every step of every layer multiplies the input and the previous hidden state by
the gate weights, so over all rows (time steps x batch, or the packed rows):

    forward  = 2 * rows * sum(numel of each 2-D weight)   # w_ih: (gates*H, in), w_hh: (gates*H, H), w_hr
    backward = forward per gradient computed (input and weights): 2x forward on both backends

GRU and plain RNN on a CPU, LSTMCell loops and LSTMs in other dtypes decompose into mm/addmm,
which torch counts already.

Grouped matmuls. transformers' Mixtral-style experts (`experts_implementation="grouped_mm"`, the
default in transformers 5) run every expert's MLP on its gathered tokens as one `aten._grouped_mm`,
uncounted by torch, so a MoE step counted little more than attention and the router. Every row
meets one group's weight, so it costs what one plain matmul of the same shapes costs (see
grouped_mm_flops). Experts written as a loop over `torch.where` /
index_select / index_add_ with nn.Linear are plain mm calls on the gathered tokens, counted already.

Known limitations: multiply-adds count as 2 FLOPs and bias gradients and gate nonlinearities are
not counted, as in torch's own formulas; a grouped matmul whose `offs` leave rows out is counted
as if it covered them all (reading `offs` would sync a GPU); MIOpen RNNs (ROCm) are not counted.
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


def _rnn_rows(input_shape) -> int:
    """Rows the gate matmuls run over: time x batch (either layout), or packed rows."""
    return prod(input_shape[:-1])


def _weights_numel(shapes) -> int:
    return sum(prod(s) for s in shapes if s is not None and len(s) == 2)


def mkldnn_rnn_layer_flops(input_shape, w_ih, w_hh, *_args, **_kwargs) -> int:
    """FLOPs of one fused CPU RNN layer and direction: 2 * rows * (numel(w_ih) + numel(w_hh))."""
    return 2 * _rnn_rows(input_shape) * _weights_numel([w_ih, w_hh])


def mkldnn_rnn_layer_backward_flops(input_shape, w_ih, w_hh, *_args, **_kwargs) -> int:
    """Its backward computes the input and the weight gradients: twice the forward."""
    return 2 * mkldnn_rnn_layer_flops(input_shape, w_ih, w_hh)


def cudnn_rnn_flops(input_shape, weights, *_args, **_kwargs) -> int:
    """FLOPs of a whole cuDNN RNN (all layers and directions): 2 * rows * numel of its weight matrices."""
    return 2 * _rnn_rows(input_shape) * _weights_numel(weights)


def cudnn_rnn_backward_flops(input_shape, weights, *args, **kwargs) -> int:
    """One forward's worth for the data gradients (input, hx, cx) and one for the weights, as asked."""
    mask = kwargs.get("output_mask", args[-1] if args else (True, True, True, True))
    wanted = int(any(bool(m) for m in mask[:3])) + int(bool(mask[3]))
    return wanted * cudnn_rnn_flops(input_shape, weights)


def grouped_mm_flops(a_shape, b_shape, *_args, **_kwargs) -> int:
    """FLOPs of aten._grouped_mm: 2 * groups * M * K * N, groups > 1 only when both operands are 3-D.

    (M, K) @ (G, K, N) and (G, M, K) @ (K, N) give (M, N) with K per row; (M, K) @ (K, N) with K split
    by offs gives G blocks that together cover K once; (G, M, K) @ (G, K, N) is a batched matmul.
    """
    groups = a_shape[0] if len(a_shape) == 3 and len(b_shape) == 3 else 1
    return 2 * groups * a_shape[-2] * a_shape[-1] * b_shape[-1]


_EXTRA_FORMULAS = {
    "convolution_backward": conv_backward_flops,
    "mkldnn_rnn_layer": mkldnn_rnn_layer_flops,
    "mkldnn_rnn_layer_backward": mkldnn_rnn_layer_backward_flops,
    "_cudnn_rnn": cudnn_rnn_flops,
    "_cudnn_rnn_backward": cudnn_rnn_backward_flops,
    "_grouped_mm": grouped_mm_flops,
}


def flop_counter() -> FlopCounterMode:
    """A FlopCounterMode (no display) with the corrected convolution backward and the formulas above."""
    mapping = {
        getattr(torch.ops.aten, name): formula
        for name, formula in _EXTRA_FORMULAS.items()
        if hasattr(torch.ops.aten, name)  # an op this build lacks is simply not counted
    }
    return FlopCounterMode(display=False, custom_mapping=mapping)

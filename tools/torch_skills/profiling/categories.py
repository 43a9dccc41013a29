"""Sort profiler event names into kinds of work (no torch).

Use `op_category("aten::addmm")` -> "matmul", `op_category("aten::mul_", phase="optimizer")` ->
"optimizer". The categories feed `op_categories` in the result and the findings (a convolution-heavy
step gets the channels_last advice, an elementwise-heavy one the fusion advice).
"""

from __future__ import annotations

import re

from torch_skills.profiling.models import OpCategory

_RULES: tuple[tuple[OpCategory, re.Pattern[str]], ...] = (
    ("host_sync", re.compile(
        r"^aten::(_local_scalar_dense|item|nonzero|masked_select|_unique2?|unique_dim|unique_consecutive|is_nonzero)$"
        r"|^cuda(Stream|Device|Event)Synchronize$")),
    ("attention", re.compile(r"scaled_dot_product|flash_attention|efficient_attention|_cudnn_attention")),
    ("convolution", re.compile(r"^aten::(_?convolution(_backward)?|conv\dd|conv_transpose\dd|mkldnn_convolution"
                               r"|cudnn_convolution\w*|miopen_convolution\w*|_?slow_conv\w*|thnn_conv\w*"
                               r"|_nnpack_spatial_convolution|_?conv_depthwise\w*)$")),
    ("matmul", re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|addmv|mv|dot|vdot|einsum|_scaled_mm"
                          r"|addbmm|mkldnn_linear|_addmm_activation|linear_backward)$")),
    ("normalization", re.compile(r"(layer|batch|group|instance|rms)_?norm|_batch_norm_impl_index"
                                 r"|native_(layer|batch|group)_norm")),
    ("reduction", re.compile(r"^aten::(sum|mean|amax|amin|max|min|argmax|argmin|norm|linalg_vector_norm|var|std"
                             r"|var_mean|prod|cumsum|cumprod|logsumexp|_softmax|softmax|_log_softmax|log_softmax"
                             r"|_softmax_backward_data|_log_softmax_backward_data|nll_loss\w*|cross_entropy_loss"
                             r"|mse_loss\w*|topk|sort|all|any)$")),
    ("memory_copy", re.compile(r"^aten::(copy_|_to_copy|to|clone|contiguous|cat|stack|index_select|gather|scatter"
                               r"|scatter_add_?|index|index_put_?|embedding|embedding_dense_backward|fill_|zero_"
                               r"|zeros|zeros_like|ones|ones_like|full|full_like|pad|constant_pad_nd|repeat"
                               r"|_foreach_copy_|masked_fill_?|flip|roll|narrow_copy|_unsafe_view|new_zeros)$"
                               r"|^Memcpy|^Memset")),
    ("optimizer", re.compile(r"^aten::_foreach_|^aten::_fused_(adam|adamw|sgd)")),
    ("autograd", re.compile(r"^autograd::|^torch::autograd::|Backward\d*$")),
    ("elementwise", re.compile(r"^aten::(add|sub|rsub|mul|div|neg|abs|relu|relu_|gelu|silu|mish|elu|leaky_relu|hardtanh"
                               r"|tanh|sigmoid|exp|exp2|expm1|log|log1p|log2|pow|sqrt|rsqrt|reciprocal|sin|cos|erf"
                               r"|where|clamp|clamp_min|clamp_max|threshold|threshold_backward|gelu_backward"
                               r"|silu_backward|tanh_backward|sigmoid_backward|dropout|native_dropout|bernoulli_"
                               r"|lerp|addcmul|addcdiv|maximum|minimum|sign|square|floor|ceil|round|eq|ne|gt|lt|ge|le"
                               r"|logical_\w+|bitwise_\w+|hardswish|hardsigmoid|softplus|mish_backward|_log_softmax"
                               r"|rand|randn|rand_like|randn_like|uniform_|normal_|exponential_|frac|trunc)_?$")),
)  # fmt: skip


def op_category(name: str, phase: str | None = None) -> OpCategory:
    """The kind of work an event name stands for; anything run by the optimizer is 'optimizer'."""
    for category, pattern in _RULES:
        if category == "host_sync" and pattern.search(name):
            return category
    if phase == "optimizer" and not name.startswith("cuda"):
        return "optimizer"
    for category, pattern in _RULES:
        if pattern.search(name):
            return category
    return "other"

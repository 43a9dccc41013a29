"""Scratch memory that CUDA kernels take from the caching allocator inside one op, computed on any device.

Use (the ledger calls it after each op when the estimate's target is a CUDA device):

    model = CudaKernelModel(GpuSpec.local_or_default())
    model.scratch(func, args, kwargs)     # -> [bytes of each buffer the kernel allocates and frees]

A trace on fake tensors sees an op's outputs, not the buffers its CUDA kernel allocates for itself
and frees before it returns. Most kernels allocate nothing; the ones modelled here do, and their
sizes follow from the shapes alone, so the model works whether the trace runs on CPU or CUDA:

- TensorIterator reductions (`sum`, `mean` over some dims) whose reduced dims are the outer ones,
  as in a Linear layer's bias gradient (`grad_out.sum(0)` over B*T rows). When the output is too
  small to keep the GPU busy, `setReduceConfig` (aten/src/ATen/native/cuda/Reduce.cuh) splits each
  output's inputs over `ctas_per_output` thread blocks and reduces their partial results through a
  global-memory buffer of `acc_bytes * outputs * ctas_per_output * block.x * output_vec_size` bytes
  plus one int semaphore per block column. On an H100, a bf16 `sum(0)` of a (6304, 1536) gradient
  takes a 77,856,768 B buffer and 48 B of semaphores (measured: bench/gpu/results/peakdiff.json).

- cuDNN's attention backward (`_scaled_dot_product_cudnn_attention_backward`): an fp32 accumulator
  for dQ and one fp32 row statistic per query, plus 256 B: 4*B*H*T*D + 4*B*H*T + 256 bytes,
  measured to the byte on an H100 for (32, 6, 197, 64), (8, 12, 512, 64) and (8 or 16, 12, 1024 or
  512, 64) bf16 queries.

- nn.TransformerEncoderLayer's fused inference path (`_transformer_encoder_layer_fwd`, taken in eval
  mode without autocast): one op to the trace, whose intermediates (aten/src/ATen/native/transformers/
  transformer.cpp and attention.cpp) peak either at the end of attention (the packed qkv projection,
  3 rows of E, and the attention output, 1 row) or inside the feed-forward (the residual, 1 row, and
  the hidden layer, F/E rows), besides the layer's input and output. Measured on an H100 for a
  4-layer 768-wide encoder at batch 16 x 512: 333.2 MiB fp32 and 184.0 MiB bf16, which is the
  parameters, workspaces and input plus 7 rows (input, residual, 4 hidden, output) of 24 / 12 MiB.

The reduction sizes depend on the GPU's SM count and threads per SM (`GpuSpec`): the local GPU's when the
worker has one, else an H100's (132 SMs, 2048 threads each), stated in the result's assumptions.

Known limitations: reductions over the innermost (contiguous) dims, or over non-contiguous inputs,
are not modelled (their buffer is at most a few KiB per output row); neither are the flash and
memory-efficient attention backward kernels, whose workspaces the `KernelProbe` measures when the
trace runs on the GPU (a trace on CPU never calls the CUDA attention kernels at all). The fused
encoder layer is modelled on its SDPA path (no padding mask, head dim a multiple of 8); with a mask
the kernel materialises (B, H, T, T) attention scores, which are missing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

aten = torch.ops.aten

H100_SMS = 132  # NVIDIA H100 SXM5: 132 SMs
THREADS_PER_SM = 2048  # maxThreadsPerMultiProcessor on V100, A100, H100 (1024 on sm75, 1536 on sm86/89)

MAX_NUM_THREADS = 512  # ReduceConfig::MAX_NUM_THREADS (threads per block)
WARP = 32
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256

REDUCTIONS = {aten.sum.dim_IntList, aten.mean.dim}
CUDNN_ATTENTION_BACKWARD = aten._scaled_dot_product_cudnn_attention_backward.default
ENCODER_LAYER_FWD = aten._transformer_encoder_layer_fwd.default


@dataclass(frozen=True)
class GpuSpec:
    """What the launch configuration of a kernel depends on."""

    sm_count: int = H100_SMS
    threads_per_sm: int = THREADS_PER_SM
    name: str = "NVIDIA H100 (assumed)"

    @staticmethod
    def local_or_default() -> GpuSpec:
        """The local GPU's figures, or an H100's when this machine has none."""
        if not torch.cuda.is_available():
            return GpuSpec()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return GpuSpec(props.multi_processor_count, props.max_threads_per_multi_processor, props.name)


class CudaKernelModel:
    """Scratch buffers of the CUDA kernels named in the module docstring, from shapes alone."""

    def __init__(self, gpu: GpuSpec):
        self.gpu = gpu

    def scratch(self, func, args, kwargs) -> list[int]:
        if func in REDUCTIONS:
            return self._reduction(args, kwargs)
        if func is CUDNN_ATTENTION_BACKWARD:
            return cudnn_attention_backward_buffers(args[1])
        if func is ENCODER_LAYER_FWD:
            return encoder_layer_buffers(args[0], args[14])
        return []

    def _reduction(self, args, kwargs) -> list[int]:
        x = args[0]
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        if (
            not isinstance(x, torch.Tensor)
            or not x.is_floating_point()
            or not x.is_contiguous()
            or x.dim() == 0
        ):
            return []
        if not dims:  # a full reduction: one output, a buffer of a few bytes
            return []
        reduced = sorted({d % x.dim() for d in dims})
        kept = x.dim() - len(reduced)
        if kept == 0 or reduced != list(range(len(reduced))):
            return []  # reduced dims are not all outer ones: not modelled
        inputs = math.prod(x.shape[: len(reduced)])
        outputs = math.prod(x.shape[len(reduced) :])
        acc_bytes = 8 if x.dtype == torch.float64 else 4  # at::acc_type: float for half/bf16/float
        return outer_reduction_buffers(inputs, outputs, acc_bytes, self.gpu)


def outer_reduction_buffers(inputs: int, outputs: int, acc_bytes: int, gpu: GpuSpec) -> list[int]:
    """[global buffer, semaphores] bytes of a reduction of `inputs` rows into `outputs` contiguous
    columns (`setReduceConfig`, the "reduce over a non-fastest dim" branch), or [] when it needs none."""
    if inputs <= 1 or outputs <= 0:
        return []
    vec = 4  # get_output_vec_size: 4, halved until it divides the output row
    while outputs % vec:
        vec //= 2
    dim0, dim1 = outputs // vec, inputs
    max_threads = MAX_NUM_THREADS // vec
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    width = min(dim0_pow2, WARP)
    height = min(dim1_pow2, max_threads // width)
    width = min(dim0_pow2, max_threads // height)
    threads = width * height
    step_output = width  # the block's x threads split the outputs
    step_input = 1
    values_per_thread = inputs
    if values_per_thread >= height * 16 or values_per_thread >= MAX_VALUES_PER_THREAD:
        step_input = height  # the block's y threads split the inputs
        split_input = True
    else:
        step_output *= height
        split_input = False
    values_per_thread = -(-inputs // step_input)
    grid_x = -(-(outputs // vec) // step_output)
    target_grid = gpu.sm_count * (gpu.threads_per_sm // threads)
    if not (split_input and values_per_thread >= MAX_VALUES_PER_THREAD and grid_x <= target_grid):
        return []
    ctas = max(
        min(-(-target_grid // grid_x), -(-values_per_thread // MIN_VALUES_PER_THREAD)),
        -(-values_per_thread // MAX_VALUES_PER_THREAD),
    )
    if ctas <= 1:
        return []
    return [acc_bytes * outputs * ctas * width * vec, 4 * grid_x]


def cudnn_attention_backward_buffers(query: torch.Tensor) -> list[int]:
    """[workspace bytes] of cuDNN's SDPA backward for a (B, H, T, D) query: fp32 dQ and row statistics."""
    if not isinstance(query, torch.Tensor) or query.dim() != 4:
        return []
    b, h, t, d = query.shape
    return [4 * b * h * t * d + 4 * b * h * t + 256]


def encoder_layer_buffers(src: torch.Tensor, ffn_weight_1: torch.Tensor) -> list[int]:
    """Intermediates alive at the peak of one fused encoder layer, besides its input and output.

    Attention ends holding the (B, T, 3E) qkv projection and the (B, T, E) attention output (the
    projected output is the size of the layer's output, counted by the trace); the feed-forward
    holds the (B, T, E) residual and the (B, T, F) hidden layer while it writes its output."""
    if not isinstance(src, torch.Tensor) or src.dim() != 3 or not isinstance(ffn_weight_1, torch.Tensor):
        return []
    row = src.numel() * src.element_size()  # (B, T, E)
    hidden = row * ffn_weight_1.shape[0] // src.shape[-1]  # (B, T, F)
    attention = [3 * row, row]
    feed_forward = [row, hidden]
    return max(attention, feed_forward, key=sum)


def _last_pow2(n: int) -> int:
    return max(1, 1 << (int(n).bit_length() - 1))

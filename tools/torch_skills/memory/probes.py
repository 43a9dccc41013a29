"""Measure, on real tensors, what a fake kernel cannot say: its scratch memory and true output sizes.

Use (the ledger calls it for the ops in PROBED_OPS when their outputs are fake):

    probe = KernelProbe(device="cpu", scratch=True)
    found = probe.measure(func, args, kwargs)      # ProbeResult or None (over budget, failed)
    found.output_nbytes, found.scratch_bytes
    out, found = probe.call(func, args, kwargs)    # real tensors: run the op and measure that very call

Two kinds of kernel memory are invisible to a trace on fake tensors:

- outputs whose fake (meta) implementation reports a wrong size: the RNN kernels' workspace or
  reserve, which training saves for backward, is 0 bytes in torch's meta functions for
  `mkldnn_rnn_layer` and `_cudnn_rnn`;
- scratch a kernel allocates and frees inside the call: oneDNN reorders a convolution's input,
  weight and output into blocked layouts on CPU; cuDNN asks for a workspace on CUDA; the CUDA
  flash and memory-efficient attention backward kernels allocate fp32 accumulators.

The probe runs the real kernel once per distinct signature (shapes, strides, dtypes, the other
arguments), on zero-filled tensors of the traced shapes on the traced device, and measures its
peak: on CPU from the CPU allocator's profiler events, on CUDA from `max_memory_allocated`.
`scratch_bytes` is the peak inside the call above the inputs, minus the outputs it returns.
When the step itself runs on real tensors (the fallback after a failed fake trace), `call` measures
the op's own run instead, once per signature: without it a real-run estimate misses all scratch.

Known limitations: probing costs one real run of the kernel. A convolution signature whose
tensors exceed `max_bytes`, or any after `budget_s` seconds of probing, is probed at batches 2
and 3 instead and its scratch extrapolated linearly to the batch (counted in `scaled`; within a
few percent of a full probe on the models tried, a few kernels keep a batch-independent part);
other ops, and convolutions past SCALED_BUDGET x `budget_s`, are skipped (counted in `skipped`). Scratch measured on one device says nothing about another, so the worker only probes
scratch when the traced device is the target device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves, tree_map

aten = torch.ops.aten

# Ops whose outputs may be under-reported by their fake implementation (size fixed from the probe).
WORKSPACE_OPS = {
    aten.mkldnn_rnn_layer.default,
    aten._cudnn_rnn.default,
}
# Ops known to allocate scratch inside the kernel.
SCRATCH_OPS = {
    aten.convolution.default,
    aten.convolution_backward.default,
    aten.mkldnn_rnn_layer.default,
    aten.mkldnn_rnn_layer_backward.default,
    aten._cudnn_rnn.default,
    aten._cudnn_rnn_backward.default,
    # the CPU flash-attention kernels allocate per-thread blocks of scores and running sums (427 kB at
    # batch 2 for a 256-token bf16 head of 64: a diffusers VAE's mid-block attention peak, -5.7% without)
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    # CUDA attention backward kernels take a workspace (9-49 MiB measured on an H100); a trace on
    # CPU never calls them. cuDNN's is sized from shapes instead (torch_skills.memory.cudakernels).
    aten._scaled_dot_product_efficient_attention_backward.default,
    aten._scaled_dot_product_flash_attention_backward.default,
}
PROBED_OPS = WORKSPACE_OPS | SCRATCH_OPS
_READS_WORKSPACE = {aten.mkldnn_rnn_layer_backward.default, aten._cudnn_rnn_backward.default}
# Past the time budget (or over max_bytes), convolutions are still probed at batches 2 and 3 and
# scaled, until this many times the budget is spent: scratch extrapolated beats scratch dropped.
SCALED_BUDGET = 3.0


@dataclass(frozen=True)
class ProbeResult:
    output_nbytes: tuple[int, ...]  # storage bytes of each tensor output, in tree order
    output_numels: tuple[int, ...]
    scratch_bytes: int


class KernelProbe:
    """Runs probed kernels for real, once per signature; see the module docstring."""

    def __init__(
        self, device: str | torch.device, *, scratch: bool, max_bytes: int = 1 << 30, budget_s: float = 20.0
    ):
        self.device = torch.device(device)
        self.scratch = scratch
        self.max_bytes = max_bytes
        self.budget_s = budget_s
        self.spent_s = 0.0
        self.skipped = 0
        self.probed = 0
        self.scaled = 0  # signatures whose scratch was extrapolated from batches 2 and 3
        self._cache: dict[tuple, ProbeResult | None] = {}

    def wants(self, func) -> bool:
        return func in WORKSPACE_OPS or (self.scratch and func in SCRATCH_OPS)

    def measures_calls(self, func) -> bool:
        """Whether `call` should run this op: real tensors, and an op whose scratch is wanted."""
        return self.scratch and func in SCRATCH_OPS

    def call(self, func, args, kwargs):
        """Run `func` on real tensors and return (its output, its ProbeResult): the call itself is measured.

        Used when the step runs for real (the fallback after a failed fake trace): the kernel runs anyway,
        so its scratch is read off the allocator during that same call, once per signature; later calls
        with the same signature reuse the figure."""
        key = (func, *(_signature(a) for a in tree_leaves((args, kwargs))))
        if key in self._cache:
            return func(*args, **kwargs), self._cache[key]
        start = time.perf_counter()
        out, peak = self._peak(lambda: func(*args, **kwargs))
        self.spent_s += time.perf_counter() - start
        self.probed += 1
        result = self._result(out, peak)
        self._cache[key] = result
        return out, result

    def measure(self, func, args, kwargs) -> ProbeResult | None:
        key = (func, *(_signature(a) for a in tree_leaves((args, kwargs))))
        if key in self._cache:
            return self._cache[key]
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        size = sum(t.untyped_storage().nbytes() for t in tensors)
        if func in _READS_WORKSPACE and any(t.dtype == torch.uint8 and t.numel() == 0 for t in tensors):
            # a backward kernel handed an empty workspace would read past its end: never run it
            self._cache[key] = None
            return None
        full = size <= self.max_bytes and self.spent_s <= self.budget_s
        if not full and (self.spent_s > SCALED_BUDGET * self.budget_s or _batch_of(func, args) is None):
            self.skipped += 1
            self._cache[key] = None
            return None
        start = time.perf_counter()
        try:
            result = self._run(func, args, kwargs) if full else self._scaled(func, args, kwargs)
        except Exception:  # a kernel that will not run on zeros here: keep the fake figures
            result = None
        self.spent_s += time.perf_counter() - start
        if full:
            self.probed += 1
        elif result is not None:
            self.scaled += 1
        else:
            self.skipped += 1
        self._cache[key] = result
        return result

    def _run(self, func, args, kwargs) -> ProbeResult:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # grad mode as traced: RNN kernels keep their workspace only under it
            real_args, real_kwargs = tree_map(self._zeros_like, (args, kwargs))
            out, peak = self._peak(lambda: func(*real_args, **real_kwargs))
            return self._result(out, peak)

    def _scaled(self, func, args, kwargs) -> ProbeResult | None:
        """Scratch at the traced batch B, from real runs at batches 2 and 3 extrapolated linearly.

        For a signature too large or too late for a full probe: the convolution kernels' scratch
        (im2col columns, blocked-layout reorders) grows linearly with the batch from batch 2 on (at
        batch 1 oneDNN may pick another algorithm, so batch 1 is not used), and the two small runs
        cost 5/B of one full run. Outputs are not sized from it (convolutions' fake sizes are right)."""
        batch = _batch_of(func, args)
        if batch is None or batch <= 3:
            return None
        found = []
        for b in (2, 3):
            small = list(args)
            for i in _BATCHED_ARGS[func]:
                small[i] = _Shrunk(args[i], b)
            if sum(t.nbytes for t in small if isinstance(t, _Shrunk)) > self.max_bytes:
                return None
            found.append(self._run(func, tuple(small), kwargs).scratch_bytes)
        return ProbeResult((), (), max(0, found[0] + (found[1] - found[0]) * (batch - 2)))

    def _peak(self, fn):
        """(fn's result, peak bytes the device's allocator held above its level at the call)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
            out = fn()
            torch.cuda.synchronize(self.device)
            return out, torch.cuda.max_memory_allocated(self.device) - base
        return _cpu_peak(fn)

    @staticmethod
    def _result(out, peak: int) -> ProbeResult:
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        out_bytes = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in outs}.values())
        return ProbeResult(
            output_nbytes=tuple(t.untyped_storage().nbytes() for t in outs),
            output_numels=tuple(t.numel() for t in outs),
            scratch_bytes=max(0, peak - out_bytes),
        )

    def _zeros_like(self, value):
        if isinstance(value, _Shrunk):
            return value.zeros(self.device)
        if not isinstance(value, torch.Tensor):
            return value
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=self.device).zero_()


# Per op, the arguments whose leading dimension is the batch (convolution: input; backward: grad_output, input).
_BATCHED_ARGS = {
    aten.convolution.default: (0,),
    aten.convolution_backward.default: (0, 1),
}


def _batch_of(func, args) -> int | None:
    """The batch the batched arguments share, when each lays its batch dimension outermost; else None."""
    positions = _BATCHED_ARGS.get(func)
    if positions is None or len(args) <= max(positions):
        return None
    tensors = [args[i] for i in positions]
    if not all(isinstance(t, torch.Tensor) and t.dim() >= 3 for t in tensors):
        return None
    batch = tensors[0].shape[0]
    if any(t.shape[0] != batch or t.stride(0) != max(t.stride()) for t in tensors):
        return None
    return int(batch)


class _Shrunk:
    """A tensor's first `batch` rows, as the zero tensor a scaled probe runs on (same strides, so same layout)."""

    def __init__(self, tensor: torch.Tensor, batch: int):
        self.shape = (batch, *tensor.shape[1:])
        self.stride = tuple(tensor.stride())
        self.dtype = tensor.dtype
        self.nbytes = batch * tensor.stride(0) * tensor.element_size()

    def zeros(self, device: torch.device) -> torch.Tensor:
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device).zero_()


class CudaScratchMeter:
    """On real CUDA tensors, the bytes each op allocated and freed inside itself.

    Use (the ledger wraps every op with it when a step runs for real on the GPU, the fallback
    when tracing on fake tensors fails):

        meter = CudaScratchMeter("cuda")
        meter.start(); out = func(*args); scratch = meter.stop()

    The in-op peak of `memory_allocated` above both the level before and the level after the op:
    cuDNN and reduction workspaces, which a storage ledger cannot see (an LSTM's training forward
    takes ~28 MiB at batch 16 on an H100 that a ledger of real storages missed).
    """

    def __init__(self, device: str | torch.device):
        self.device = torch.device(device)
        self._before = 0

    def start(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)
        self._before = torch.cuda.memory_allocated(self.device)

    def stop(self) -> int:
        peak = torch.cuda.max_memory_allocated(self.device)
        return max(0, peak - max(self._before, torch.cuda.memory_allocated(self.device)))


def _signature(value) -> tuple:
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), tuple(value.stride()), value.dtype, value.device.type)
    return ("V", repr(value))


def _cpu_peak(fn):
    """(fn's result, peak bytes the CPU allocator held above its level at the call).

    torch_skills.memory.groundtruth sums the same profiler events for the bench's ground truth; the two
    are kept apart on purpose, so that the truth shares no code with the estimate.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    deltas: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if type(node.extra_fields).__name__ == "_ExtraFields_Allocation":
            deltas.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    deltas.sort(key=lambda d: d[0])
    live = peak = 0
    for _, delta in deltas:
        live += delta
        peak = max(peak, live)
    return out, peak

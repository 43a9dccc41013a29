"""Run one training (or inference) step under the storage ledger, on fake or real tensors.

Use:

    spec = StepSpec(mode="train", optimizer="adamw", precision="bf16_autocast", foreach=True)
    trace = trace_step(build_model, make_batch, loss_fn, spec, device="cpu", fake=True)
    trace.events, trace.param_bytes, trace.fsdp_units ...

`build_model()` returns an nn.Module, `make_batch(batch_size)` one batch, `loss_fn(output, batch)`
a scalar. With `fake=True` all three run under a FakeTensorMode, so a 7B-parameter model is built
and stepped without allocating its memory: parameters, activations and optimizer state are fake
tensors that carry only shape, dtype and device.

The step that is measured is the steady state of a training loop:

    output = model(batch); loss = loss_fn(output, batch)   # autocast around these two if asked
    loss.backward()                                        # repeated per micro-batch (<= 2 traced)
    optimizer.step(); optimizer.zero_grad(set_to_none=True)

A warm-up step that is not measured creates the optimizer state first (Adam's moments exist
from the first step on, so the second step is the one that peaks). `output` and `loss` stay
referenced until the step ends and die with it, as in a `train_step()` function that names them.

Known limitations: the step runs on the device that traces it: on a machine without a GPU that is
the CPU, so CUDA-only kernel choices (autocast op lists, SDPA back-ends, cuDNN's saved tensors)
follow the CPU's. The optimizer's CUDA default (foreach) is reproduced by `StepSpec.foreach`.
GradScaler (fp16) memory is a few scalars and is not traced. A factory that loads real weights
(`torch.load`, `from_pretrained`) may read them into memory even under the fake mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from torch_skills.memory.construct import fake_safe_construction, fakeify_real_tensors
from torch_skills.memory.cudakernels import CudaKernelModel
from torch_skills.memory.ledger import StorageLedger
from torch_skills.memory.modules import ModuleScope
from torch_skills.memory.probes import CudaScratchMeter, KernelProbe
from torch_skills.runner import usercode

OUTSIDE_MODULES = "(outside any module: loss, functional code)"
LOW_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}
AUTOCAST = {"bf16_autocast": torch.bfloat16, "fp16_autocast": torch.float16}


class CheckpointTargetMissing(ValueError):
    """activation_checkpointing named classes that the model does not contain."""


@dataclass(frozen=True)
class StepSpec:
    """What step to run: train or inference, which optimizer, which precision."""

    mode: str = "train"  # train | inference
    optimizer: str = "adamw"  # adamw | adam | sgd | sgd_momentum | none
    precision: str = "fp32"  # fp32 | bf16 | fp16 | bf16_autocast | fp16_autocast
    checkpoint_classes: tuple[str, ...] = ()  # module class names whose forward is recomputed
    micro_batches: int = 1  # forward+backward passes before the optimizer step (traced: at most 2)
    foreach: bool | None = None  # None: torch's default for the traced device; True: CUDA's default
    lr: float = 1e-3


@dataclass
class Trace:
    """The ledger's events plus the facts about the model that the later stages need."""

    events: list
    batch_size: int | None
    param_count: int
    trainable_param_count: int
    param_bytes: int
    trainable_param_bytes: int
    buffer_bytes: int
    input_bytes: int
    op_count: int
    module_types: dict[str, str]  # qualified name -> class name
    fsdp_units: dict[str, int] = field(default_factory=dict)  # unit name -> parameter bytes
    checkpointed_modules: int = 0
    kernels_probed: int = (
        0  # kernels run for real to measure their scratch / workspace (torch_skills.memory.probes)
    )
    kernels_not_probed: int = 0  # probes skipped for size or time: their scratch is missing
    kernels_scaled: int = 0  # convolutions probed at batches 2 and 3 (size or time): scratch extrapolated
    kernel_gpu: str | None = None  # the GPU whose CUDA kernel scratch was modelled (cudakernels.GpuSpec)


def fake_mode():
    """A FakeTensorMode that accepts real tensors the user's code creates (constants, RNG state)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def trace_step(
    build_model: Callable[[], torch.nn.Module],
    make_batch: Callable[[int | None], Any],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    spec: StepSpec,
    *,
    device: str | torch.device = "cpu",
    batch_size: int | None = None,
    fake: bool = True,
    probe_scratch: bool = True,
    cuda_kernels: CudaKernelModel | None = None,
) -> Trace:
    """Build the model and a batch, run the step, return the ledger's trace (see module docstring).

    `cuda_kernels` (for a CUDA target) adds the scratch of CUDA kernels that fake tensors cannot see.
    """
    device = torch.device(device)
    outer = fake_mode() if fake else contextlib.nullcontext()
    with outer:
        with (
            torch.device(device) if device.type != "cpu" else contextlib.nullcontext(),
            fake_safe_construction() if fake else contextlib.nullcontext(),
        ):
            model = build_model()
        if fake:
            fakeify_real_tensors(model, outer)
        convert_tensors(model, device, LOW_PRECISION.get(spec.precision))
        checkpointed = wrap_checkpointing(model, spec.checkpoint_classes)
        model.train(spec.mode == "train")
        batch = _to_batch(make_batch(batch_size), device, LOW_PRECISION.get(spec.precision))
        optimizer = make_optimizer(model, spec) if spec.mode == "train" else None
        if optimizer is not None:
            _create_optimizer_state(model, optimizer)

        scope = ModuleScope(model)
        # fake steps: probe runs; a real CPU step: the kernels' own calls; a real GPU step: every op's workspace
        probe = KernelProbe(device, scratch=probe_scratch) if fake or device.type != "cuda" else None
        meter = CudaScratchMeter(device) if not fake and device.type == "cuda" and probe_scratch else None
        ledger = StorageLedger(scope, probe, cuda_kernels, meter)
        _adopt_state(ledger, model, batch, optimizer)
        with scope, ledger:
            if spec.mode == "train":
                _train_step(model, batch, loss_fn, optimizer, spec, ledger, scope, device)
            else:
                _inference_step(model, batch, spec, ledger, device)
        events = ledger.events

    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    return Trace(
        events=events,
        batch_size=batch_size if batch_size is not None else leading_dim(batch),
        param_count=sum(p.numel() for p in params),
        trainable_param_count=sum(p.numel() for p in trainable),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        trainable_param_bytes=sum(p.numel() * p.element_size() for p in trainable),
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
        input_bytes=sum(
            t.numel() * t.element_size() for t in tree_leaves(batch) if isinstance(t, torch.Tensor)
        ),
        op_count=sum(1 for tag, _ in events if tag == "op"),
        module_types={name: type(m).__name__ for name, m in model.named_modules()},
        fsdp_units=fsdp_units(model, spec.checkpoint_classes),
        checkpointed_modules=checkpointed,
        kernels_probed=probe.probed if probe is not None else 0,
        kernels_not_probed=probe.skipped if probe is not None else 0,
        kernels_scaled=probe.scaled if probe is not None else 0,
        kernel_gpu=cuda_kernels.gpu.name if cuda_kernels is not None else None,
    )


# -- the step ---------------------------------------------------------------------------------
def _train_step(model, batch, loss_fn, optimizer, spec, ledger, scope, device) -> None:
    def pack(tensor: torch.Tensor) -> torch.Tensor:
        ledger.classify(tensor, "activation", saved_by=scope.current() or OUTSIDE_MODULES)
        return tensor

    output = loss = None
    for _ in range(max(1, min(spec.micro_batches, 2))):
        ledger.phase("forward")
        with torch.autograd.graph.saved_tensors_hooks(pack, _unpack), _autocast(spec, device):
            output = call_model(model, batch)  # the previous micro-batch's output dies on rebinding
            loss = loss_fn(output, batch)
        ledger.phase("backward")
        ledger.watch_backward(loss)  # the engine's gradient sums, in place as without the ledger
        loss.backward()
        scope.close_backward()
        for p in model.parameters():
            if p.grad is not None:
                ledger.classify(p.grad, "gradient")
    if optimizer is not None:
        ledger.phase("optimizer_step")
        optimizer.step()
        for tensor in _state_tensors(optimizer):
            ledger.classify(tensor, "optimizer_state")
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)
    ledger.phase("end")
    del output, loss


def _inference_step(model, batch, spec, ledger, device) -> None:
    with torch.no_grad(), _autocast(spec, device):
        ledger.phase("forward")
        output = call_model(model, batch)
        ledger.phase("end")
    del output


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _autocast(spec: StepSpec, device: torch.device):
    if spec.precision in AUTOCAST:
        return torch.autocast(device_type=device.type, dtype=AUTOCAST[spec.precision])
    return contextlib.nullcontext()


def call_model(model: torch.nn.Module, batch: Any) -> Any:
    """Call the model by the batch rule every tool uses (torch_skills.runner.usercode.split_batch)."""
    return usercode.call_model(model, batch)


# -- optimizer --------------------------------------------------------------------------------
def make_optimizer(model: torch.nn.Module, spec: StepSpec) -> torch.optim.Optimizer | None:
    """The optimizer the spec names, with `foreach` as given (None keeps torch's per-device default)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if spec.optimizer == "none" or not params:
        return None
    kwargs = {} if spec.foreach is None else {"foreach": spec.foreach}
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=spec.lr, **kwargs)
    if spec.optimizer == "adam":
        return torch.optim.Adam(params, lr=spec.lr, **kwargs)
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, **kwargs)
    if spec.optimizer == "sgd_momentum":
        return torch.optim.SGD(params, lr=spec.lr, momentum=0.9, **kwargs)
    raise ValueError(f"unknown optimizer {spec.optimizer!r}")


def _create_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Warm-up step on zero gradients so the optimizer's lazily created state exists."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def _adopt_state(ledger: StorageLedger, model, batch, optimizer) -> None:
    for p in model.parameters():
        ledger.adopt(p, "parameter")
    for b in model.buffers():
        ledger.adopt(b, "buffer")
    for t in tree_leaves(batch):
        if isinstance(t, torch.Tensor):
            ledger.adopt(t, "input")
    if optimizer is not None:
        for t in _state_tensors(optimizer):
            ledger.adopt(t, "optimizer_state")


# -- model surgery and facts ------------------------------------------------------------------
def convert_tensors(model: torch.nn.Module, device: torch.device, float_dtype: torch.dtype | None) -> None:
    """`model.to(device, dtype)` that also works on fake parameters.

    `nn.Module.to` swaps fake parameters in place (`torch.utils.swap_tensors`), which fails
    once anything holds a weak reference to them; this puts new Parameters in their slots
    instead (tied parameters stay tied).
    """
    done: dict[int, torch.Tensor] = {}

    def convert(t: torch.Tensor) -> torch.Tensor:
        dtype = float_dtype if float_dtype is not None and t.is_floating_point() else t.dtype
        if t.device == device and t.dtype == dtype and not _views_leave_storage(t):
            return t
        with torch.no_grad():
            return t.to(device=device, dtype=dtype, copy=True)

    for module in model.modules():
        for name, param in module._parameters.items():
            if param is None:
                continue
            if id(param) not in done:
                new = convert(param)
                done[id(param)] = new if new is param else torch.nn.Parameter(new, param.requires_grad)
            module._parameters[name] = done[id(param)]
        for name, buf in module._buffers.items():
            if buf is not None:
                module._buffers[name] = done.setdefault(id(buf), convert(buf))


def _views_leave_storage(t: torch.Tensor) -> bool:
    """Whether views of `t` get a storage other than its own: so with fake tensors deep-copied by
    `copy.deepcopy` (nn.TransformerEncoder clones its layer), whose weight's `t()` the ledger would
    then count as a new tensor (+4.8% measured on an H100 for a 768-wide encoder in fp32)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(t, FakeTensor) or t.layout is not torch.strided:
        return False
    with torch.no_grad():
        return t.view(t.shape).untyped_storage()._cdata != t.untyped_storage()._cdata


def wrap_checkpointing(model: torch.nn.Module, class_names: tuple[str, ...]) -> int:
    """Recompute the forward of every module whose class is named (outermost only); return how many."""
    if not class_names:
        return 0
    from torch.utils.checkpoint import checkpoint

    wanted = set(class_names)
    present = {type(m).__name__ for m in model.modules()}
    missing = sorted(wanted - present)
    if missing:
        raise CheckpointTargetMissing(
            f"activation_checkpointing names {', '.join(missing)}, which the model does not contain; "
            f"its module classes are: {', '.join(sorted(present))}"
        )
    wrapped: list[torch.nn.Module] = []
    for _, module in model.named_modules():
        if type(module).__name__ not in wanted:
            continue
        if any(_contains(outer, module) for outer in wrapped):
            continue
        inner = module.forward

        def forward(*args, _inner=inner, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        module.forward = forward
        wrapped.append(module)
    return len(wrapped)


def _contains(outer: torch.nn.Module, module: torch.nn.Module) -> bool:
    return any(m is module for m in outer.modules())


def fsdp_units(model: torch.nn.Module, preferred: tuple[str, ...] = ()) -> dict[str, int]:
    """The modules an FSDP wrap policy would shard as units, with their parameter bytes.

    Units are the outermost instances of `preferred` classes when given, else of any class that
    holds parameters and occurs at least twice (the repeated block of a network). Parameters
    outside every unit belong to the root unit, reported under the name "(root)".
    """
    counts: dict[type, int] = {}
    for m in model.modules():
        counts[type(m)] = counts.get(type(m), 0) + 1

    def is_unit(m: torch.nn.Module) -> bool:
        if m is model or not any(True for _ in m.parameters()):
            return False
        if preferred:
            return type(m).__name__ in preferred
        return counts[type(m)] >= 2

    units: dict[str, int] = {}
    covered: set[int] = set()
    for name, m in model.named_modules():
        if any(id(p) in covered for p in m.parameters(recurse=False)) or not is_unit(m):
            continue
        params = [p for p in m.parameters() if id(p) not in covered]
        if not params:
            continue
        units[name] = sum(p.numel() * p.element_size() for p in params)
        covered.update(id(p) for p in params)
    root = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in covered)
    if root:
        units["(root)"] = root
    return units


def leading_dim(batch: Any) -> int | None:
    """The first dimension of the first tensor in a batch (its batch size), or None."""
    for t in tree_leaves(batch):
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    return None


def _to_batch(batch: Any, device: torch.device, float_dtype: torch.dtype | None) -> Any:
    def move(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        t = t.to(device)
        if float_dtype is not None and t.is_floating_point():
            t = t.to(float_dtype)
        return t

    return tree_map(move, batch)

"""Pass 1: cheap forward hooks that record which modules ran and how their activations look.

Use it around the forward pass; hooks are removed on exit whatever happens:

    with ForwardProbe(model) as probe:
        output = model(batch)
    probe.activity["encoder.0"].calls       # how often it ran, in which order, with autograd on or not
    probe.activation_stats()                # zeros in ReLU-family outputs

It deliberately checks no values for NaN/Inf: a healthy run pays only for counting. When the
output, loss or a gradient turns out non-finite, `torch_skills.gradients.trace` reruns the step with
op-level tracing to find where.

Known limitations: only ReLU-family *modules* are measured; `F.relu(x)` / `x.relu()` calls inside
a forward are invisible here (their effect still shows as zero gradients on the parameters behind
them). Modules that refuse hooks (TorchScript) are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from torch_skills.gradients.models import ActivationStats
from torch_skills.gradients.tensors import tensors_in

# Activations whose negative side is exactly zero (or may be): the ones that can "die".
RELU_FAMILY: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.Threshold)


@dataclass
class _ZeroCounts:
    zeros: list[torch.Tensor] = field(default_factory=list)  # per call: scalar count of zero elements
    numel: int = 0
    # per batched call: how many output positions are zero for every sample
    dead_positions: list[torch.Tensor] = field(default_factory=list)
    positions: int = 0


@dataclass
class ModuleActivity:
    """What one module did during the forward pass."""

    name: str
    type_name: str
    calls: int = 0
    order: int | None = None  # position among modules in order of first completed call
    calls_with_grad: int = 0  # calls whose output required grad (0 with calls > 0: ran under no_grad)
    zero_counts: _ZeroCounts | None = None


class ForwardProbe:
    """Forward hooks on every module of `model` (see the module docstring)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.activity: dict[str, ModuleActivity] = {}
        self._by_module: dict[int, ModuleActivity] = {}
        self._handles: list[Any] = []
        self._completed = 0

    def __enter__(self) -> ForwardProbe:
        for name, module in self.model.named_modules():
            record = ModuleActivity(name, type(module).__name__)
            if isinstance(module, RELU_FAMILY):
                record.zero_counts = _ZeroCounts()
            self.activity[name] = record
            self._by_module[id(module)] = record
            try:
                self._handles.append(module.register_forward_hook(self._after_forward))
            except (RuntimeError, AttributeError):  # e.g. TorchScript modules
                continue
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        record = self._by_module.get(id(module))
        if record is None:
            return
        record.calls += 1
        if record.order is None:
            record.order = self._completed
            self._completed += 1
        outputs = tensors_in(output)
        if any(t.requires_grad for t in outputs):
            record.calls_with_grad += 1
        if record.zero_counts is not None and outputs:
            self._count_zeros(record.zero_counts, outputs[0])

    @staticmethod
    def _count_zeros(counts: _ZeroCounts, out: torch.Tensor) -> None:
        with torch.no_grad():
            zero = out.detach() == 0  # (B, ...) bool
            counts.zeros.append(zero.sum())
            counts.numel += zero.numel()
            if zero.dim() >= 1 and zero.shape[0] > 1:
                counts.dead_positions.append(zero.all(dim=0).sum())  # positions zero for every sample
                counts.positions += zero[0].numel()

    def activation_stats(self) -> list[ActivationStats]:
        """Zero fractions of every ReLU-family module that ran, in forward order."""
        stats = []
        ran = [
            r for r in self.activity.values() if r.zero_counts is not None and r.calls and r.zero_counts.numel
        ]
        for record in sorted(ran, key=lambda r: r.order or 0):
            counts = record.zero_counts
            assert counts is not None
            zeros = int(torch.stack(counts.zeros).sum()) if counts.zeros else 0
            dead = (
                int(torch.stack(counts.dead_positions).sum()) / counts.positions
                if counts.dead_positions and counts.positions
                else None
            )
            stats.append(
                ActivationStats(
                    module=record.name,
                    module_type=record.type_name,
                    calls=record.calls,
                    zero_fraction=zeros / counts.numel,
                    dead_unit_fraction=dead,
                )
            )
        return stats

"""Statistics over parameters and their gradients after one backward pass.

Use after `loss.backward()`:

    params = parameter_gradients(model, thresholds)          # one ParameterGradient per parameter
    profile = depth_profile(model, params, probe.activity, thresholds)
    breaks = graph_breaks(model, params, probe.activity)     # why parameters got no gradient

Norms are L2, computed in float64 so that float16/bfloat16 gradients and very large values do not
overflow while being measured; all of them are read back with one device sync.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from torch_skills.gradients.models import (
    DepthProfile,
    GradientThresholds,
    GraphBreak,
    LayerGradient,
    NonfiniteLocation,
    ParameterGradient,
)
from torch_skills.gradients.probe import ModuleActivity
from torch_skills.gradients.tensors import dtype_name, finite_or_none, kind_of


def owner_of(param_name: str) -> str:
    """'encoder.0.weight' -> 'encoder.0'; 'scale' -> '' (the top-level model)."""
    return param_name.rpartition(".")[0]


def _norm64(t: torch.Tensor) -> torch.Tensor:
    if t.is_sparse:
        t = t.coalesce().values()
    return torch.linalg.vector_norm(t.detach(), dtype=torch.float64)


def parameter_gradients(model: nn.Module, thresholds: GradientThresholds) -> list[ParameterGradient]:
    """Norms and flags of every (deduplicated) parameter's gradient."""
    named = list(model.named_parameters())
    if not named:
        return []
    norms = []
    for _, p in named:
        norms.append(_norm64(p))
        norms.append(
            _norm64(p.grad) if p.grad is not None else torch.zeros((), dtype=torch.float64, device=p.device)
        )
    values = torch.stack([n.to("cpu") for n in norms]).tolist()  # one sync for all norms
    out = []
    for i, (name, p) in enumerate(named):
        param_norm, grad_norm = values[2 * i], values[2 * i + 1]
        flags: list[str] = []
        if not math.isfinite(param_norm):
            flags.append("nonfinite_value")
        if not p.requires_grad:
            flags.append("frozen")
        has_grad = p.grad is not None
        if p.requires_grad and not has_grad:
            flags.append("no_grad")
        if has_grad:
            if not math.isfinite(grad_norm):
                flags.append("nonfinite_grad")
            elif grad_norm == 0:
                flags.append("zero_grad")
            elif grad_norm > thresholds.exploding_grad_norm:
                flags.append("large_grad")
            elif grad_norm < thresholds.small_grad_norm:
                flags.append("small_grad")
        g = finite_or_none(grad_norm) if has_grad else None
        w = finite_or_none(param_norm)
        out.append(
            ParameterGradient(
                name=name,
                shape=list(p.shape),
                requires_grad=p.requires_grad,
                grad_norm=g,
                param_norm=w,
                ratio=finite_or_none(g / w) if (g is not None and w) else None,
                flags=flags,  # type: ignore[arg-type]
            )
        )
    return out


def _l2(norms: list[float]) -> float | None:
    """L2 norm of a list of norms, scaled first so squares of huge values do not overflow."""
    if not norms:
        return None
    scale = max(norms) or 1.0
    return finite_or_none(scale * math.sqrt(sum((n / scale) ** 2 for n in norms)))


def total_grad_norm(params: list[ParameterGradient]) -> float | None:
    return _l2([p.grad_norm for p in params if p.grad_norm is not None])


def first_nonfinite_parameter(model: nn.Module) -> NonfiniteLocation | None:
    """A parameter or buffer that already holds NaN/Inf before anything runs."""
    modules = dict(model.named_modules())
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, t in tensors:
        if is_lazy(t):  # a Lazy* module's parameter before its first forward holds no values yet
            continue
        if (
            (t.is_floating_point() or t.is_complex())
            and t.numel()
            and not bool(torch.isfinite(t.detach()).all())
        ):
            owner = owner_of(name)
            return NonfiniteLocation(
                phase="parameters",
                module=owner,
                module_type=type(modules[owner]).__name__ if owner in modules else None,
                op=name.rpartition(".")[2],
                kind=kind_of(t),  # type: ignore[arg-type]
                dtype=dtype_name(t),
                located_by="parameter_scan",
            )
    return None


def depth_profile(
    model: nn.Module,
    params: list[ParameterGradient],
    activity: dict[str, ModuleActivity],
    thresholds: GradientThresholds,
    row_sparse: frozenset[str] | set[str] = frozenset(),
) -> DepthProfile:
    """Gradient norm per parameterized module, in the order the forward pass ran them.

    Modules in `row_sparse` (embeddings) are listed but left out of the first-to-last trend."""
    by_owner: dict[str, list[ParameterGradient]] = defaultdict(list)
    for p in params:
        if p.requires_grad:
            by_owner[owner_of(p.name)].append(p)
    ran = [(activity[o].order, o) for o in by_owner if o in activity and activity[o].order is not None]
    layers = []
    for depth, (_, owner) in enumerate(sorted(ran)):
        group = by_owner[owner]
        with_grad = [p for p in group if "no_grad" not in p.flags]
        finite = all(p.grad_norm is not None for p in with_grad)
        grad = _l2([p.grad_norm for p in with_grad]) if with_grad and finite else None  # type: ignore[misc]
        weights = [p.param_norm for p in group]
        weight = _l2(weights) if all(w is not None for w in weights) else None  # type: ignore[arg-type]
        layers.append(
            LayerGradient(
                depth=depth,
                module=owner,
                module_type=activity[owner].type_name,
                grad_norm=grad,
                param_norm=weight,
                ratio=finite_or_none(grad / weight) if (grad is not None and weight) else None,
            )
        )
    ratio, trend = _trend([layer for layer in layers if layer.module not in row_sparse], thresholds)
    excluded = [layer.module for layer in layers if layer.module in row_sparse]
    with_excluded = _trend(layers, thresholds)[1] if excluded else None
    return DepthProfile(
        layers=layers,
        first_to_last_ratio=ratio,
        trend=trend,  # type: ignore[arg-type]
        excluded=excluded,
        trend_with_excluded=with_excluded,  # type: ignore[arg-type]
    )


def _trend(layers: list[LayerGradient], thresholds: GradientThresholds) -> tuple[float | None, str]:
    """(first/last gradient norm ratio, trend) over the layers with a finite, non-zero gradient."""
    usable = [layer for layer in layers if layer.grad_norm]
    ratio = usable[0].grad_norm / usable[-1].grad_norm if len(usable) >= 2 else None  # type: ignore[operator]
    if ratio is None or len(usable) < 3:
        trend = "unknown"
    elif ratio > thresholds.depth_ratio:
        trend = "exploding"
    elif ratio < 1 / thresholds.depth_ratio:
        trend = "vanishing"
    else:
        trend = "stable"
    return (finite_or_none(ratio) if ratio is not None else None), trend  # trend used the raw value


def graph_breaks(
    model: nn.Module, params: list[ParameterGradient], activity: dict[str, ModuleActivity]
) -> list[GraphBreak]:
    """Group the trainable parameters without a gradient by module and say why (source filled later)."""
    unused: dict[str, list[str]] = defaultdict(list)
    for p in params:
        if "no_grad" in p.flags:
            unused[owner_of(p.name)].append(p.name)
    breaks = []
    for owner, names in unused.items():
        record = activity.get(owner)
        if record is None or record.calls == 0:
            cause = "never_ran"
        elif record.calls_with_grad == 0:
            cause = "no_grad"
        else:
            cause = "output_unused"  # refined to "detached" when the trace finds the cut
        breaks.append(
            GraphBreak(
                module=owner,
                module_type=record.type_name if record else type(model.get_submodule(owner)).__name__,
                cause=cause,  # type: ignore[arg-type]
                parameters=names,
            )
        )
    return breaks

"""Zero gradients that are there by design: parameters gated by a gain initialized to exactly zero.

Use it after the first backward, when some parameters got an all-zero gradient:

    gated = zero_init_gated(step, result.parameters)     # names that wake up after one step

Many healthy models zero-initialize the last gain of each residual branch (timm's ResNets zero
the last BatchNorm weight of every block, "zero-init residual"; layer-scale and ReZero start at
zero too). At initialization everything upstream of such a gain gets exactly zero gradient,
yet the gain itself gets one, so the first optimizer step opens the branch. This module checks
that claim instead of assuming it: it moves every exactly-zero parameter that has a non-zero
gradient by one small sign-SGD step, runs forward and backward again, and returns the
zero-gradient parameters that now get a gradient. The model's parameters, buffers and
gradients, and the CPU random generator, are restored afterwards, whatever happens.

Known limitations: one extra forward and backward, run only when a zero-gradient parameter and
an exactly-zero parameter with a gradient are both present.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_skills.gradients.models import ParameterGradient
from torch_skills.runner.usercode import call_model, user_code

STEP = 1e-2  # size of the probe step on the zero gains (sign-SGD: independent of the gradient's scale)


def zero_init_gated(step: Any, params: list[ParameterGradient]) -> list[str]:
    """Names of zero-gradient parameters that receive gradient once the zero gains take one step."""
    zero = [p.name for p in params if "zero_grad" in p.flags]
    gains = [p.name for p in params if p.param_norm == 0 and p.grad_norm and p.requires_grad]
    if not zero or not gains:
        return []
    model = step.model
    named = dict(model.named_parameters())
    saved_grads = {name: p.grad for name, p in named.items()}
    saved_buffers = [(b, b.detach().clone()) for b in model.buffers()]
    rng = torch.random.get_rng_state()
    try:
        with torch.no_grad():
            for name in gains:
                p = named[name]
                p.add_(p.grad.sign(), alpha=-STEP)
        for p in named.values():
            p.grad = None
        torch.manual_seed(step.seed)
        with user_code("the forward and backward after a probe step on the zero-initialized gains"):
            output = call_model(model, step.batch)
            loss, _ = step.loss_of(output)
            if not loss.requires_grad:
                return []
            loss.backward()
        return [n for n in zero if named[n].grad is not None and bool(named[n].grad.ne(0).any())]
    finally:
        with torch.no_grad():
            for name in gains:
                named[name].zero_()
            for buffer, value in saved_buffers:
                buffer.copy_(value)
        for name, p in named.items():
            p.grad = saved_grads[name]
        torch.random.set_rng_state(rng)

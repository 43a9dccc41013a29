"""Zero or missing gradients that are there by design: embedding rows no token used, LayerDrop skips.

Use after the first backward:

    notes = embedding_rows(model)                                   # one ByDesignZeros per embedding
    skipped = stochastic_skips(step, ["layers.3"])   # {module: (seeds that ran it, seeds tried)}
    dropped = stochastic_zero_grads(step, ["blocks.2.fc.weight"])   # {param: (seeds with grad, tried)}

An embedding's gradient is non-zero only on the rows this batch looked up (the `padding_idx` row
never), so its norm is not comparable with a dense layer's: `analysis.depth_profile` leaves
embeddings out of the first-to-last trend and this module says how many rows were untouched.

A module skipped at random in training (LayerDrop: `if self.training and torch.rand(()) < p:
continue`) gets no gradient on some steps; a branch multiplied by a random 0 (stochastic depth in
"batch" mode, as torchvision's StochasticDepth) gets an all-zero one. This is measured, not guessed
from names: the step is rerun under other seeds (forward only without autograd for skipped modules,
forward and backward for zero gradients), and what runs, or gets a non-zero gradient, with another
seed is a stochastic skip. The random
generators and the model's buffers are restored afterwards, whatever happens.

Known limitations: at most `SEEDS` extra forward passes (`SEEDS_WITH_BACKWARD` steps for zero
gradients), so a module skipped with a probability above about 0.7 may still look like a branch
never taken; a skip decided by something other than torch's random generators (Python's
`random`, numpy) is not varied by the reseeding; a rerun that raises ends the reruns and leaves
the finding as it was.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torch_skills.gradients.models import ByDesignZeros
from torch_skills.runner.errors import UserCodeError
from torch_skills.runner.usercode import call_model, user_code

SEEDS = 8  # extra seeds tried: a module skipped with p = 0.5 runs in at least one of them with p > 0.99
# Extra forward+backward steps for zero gradients: a block dropped with p = 0.2 is dropped in all 4 with
# p = 0.0016 (p = 0.5: 0.06); fewer than SEEDS because each costs a full step.
SEEDS_WITH_BACKWARD = 4
EMBEDDINGS = (nn.Embedding, nn.EmbeddingBag)


def embedding_names(model: nn.Module) -> set[str]:
    """Qualified names of the embedding modules (their gradients are row-sparse by design)."""
    return {name for name, m in model.named_modules() if isinstance(m, EMBEDDINGS)}


def _rows_with_gradient(grad: torch.Tensor) -> int:
    if grad.is_sparse:
        return int(grad.coalesce().indices()[0].unique().numel())
    return int(grad.detach().ne(0).flatten(1).any(dim=1).sum())


def embedding_rows(model: nn.Module) -> list[ByDesignZeros]:
    """For each embedding with a gradient: how many rows got none (no token looked them up)."""
    out = []
    for name, module in model.named_modules():
        if not isinstance(module, EMBEDDINGS):
            continue
        weight = module.weight
        if weight.grad is None or weight.dim() != 2:
            continue
        rows = weight.shape[0]
        untouched = rows - _rows_with_gradient(weight.grad)
        if untouched == 0:
            continue
        padding = getattr(module, "padding_idx", None)
        pad_text = f", padding_idx={padding} never does" if padding is not None else ""
        sparse = "; the gradient is sparse" if weight.grad.is_sparse else ""
        out.append(
            ByDesignZeros(
                module=name,
                module_type=type(module).__name__,
                kind="unused_embedding_rows",
                parameters=[f"{name}.weight" if name else "weight"],
                detail=f"{untouched} of {rows} rows got no token in this batch{pad_text}{sparse}",
            )
        )
    return out


def stochastic_skips(step: Any, modules: list[str]) -> dict[str, tuple[int, int]]:
    """{module: (other seeds that ran it, other seeds tried)} for the `modules` some other seed runs."""
    model = step.model
    wanted = {id(model.get_submodule(name)): name for name in modules}
    ran: dict[str, set[int]] = {name: set() for name in modules}
    current = [0]

    def count(module: nn.Module, args: Any, output: Any) -> None:
        name = wanted.get(id(module))
        if name is not None:
            ran[name].add(current[0])

    handles = [model.get_submodule(name).register_forward_hook(count) for name in modules]
    saved_buffers = [(b, b.detach().clone()) for b in model.buffers()]
    cpu_rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        with torch.no_grad(), user_code("the forward pass rerun with other seeds"):
            for k in range(1, SEEDS + 1):
                current[0] = k
                torch.manual_seed(step.seed + k)
                call_model(model, step.batch)
                if all(ran.values()):
                    break
    except UserCodeError:
        pass  # a rerun that fails decides nothing; the checked step's result stands
    finally:
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            for buffer, value in saved_buffers:
                buffer.copy_(value)
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    return {name: (len(seeds), current[0]) for name, seeds in ran.items() if seeds}


def stochastic_zero_grads(step: Any, names: list[str]) -> dict[str, tuple[int, int]]:
    """{parameter: (other seeds giving it a non-zero gradient, seeds tried)} among the zero-gradient `names`.

    The parameters' gradients, the buffers and the random generators are restored afterwards."""
    model = step.model
    named = dict(model.named_parameters())
    saved_grads = {name: p.grad for name, p in named.items()}
    saved_buffers = [(b, b.detach().clone()) for b in model.buffers()]
    cpu_rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    woke: dict[str, int] = {}
    tried = 0
    try:
        with user_code("the forward and backward rerun with other seeds"):
            for k in range(1, SEEDS_WITH_BACKWARD + 1):
                tried = k
                for p in named.values():
                    p.grad = None
                torch.manual_seed(step.seed + k)
                loss, _ = step.loss_of(call_model(model, step.batch))
                if not loss.requires_grad:
                    break
                loss.backward()
                for name in names:
                    grad = named[name].grad
                    if grad is not None and grad.is_sparse:
                        grad = grad.coalesce().values()
                    if grad is not None and bool(grad.ne(0).any()):
                        woke[name] = woke.get(name, 0) + 1
                if len(woke) == len(names):
                    break
    except UserCodeError:
        pass  # a rerun that fails decides nothing; the checked step's result stands
    finally:
        with torch.no_grad():
            for buffer, value in saved_buffers:
                buffer.copy_(value)
        for name, p in named.items():
            p.grad = saved_grads[name]
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    return {name: (count, tried) for name, count in woke.items()}

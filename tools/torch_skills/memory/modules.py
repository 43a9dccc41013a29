"""Which module is running right now, in the forward and in the backward pass.

Use it as a context manager around the step:

    scope = ModuleScope(model)
    with scope:
        scope.current()        # "layers.3.mlp.fc1" inside that module's forward or backward, "" outside

Forward: global forward pre/post hooks keep a stack of the modules entered. Backward: when a
module's forward ends, a gradient hook on its outputs marks the moment its backward starts (the
first output gradient arrives) and one on its inputs marks the end (an input gradient is
computed). The innermost module still open is the current one. Modules are named by their
path in `model.named_modules()`; modules created on the fly are named by their class.

Known limitations: a module whose inputs need no gradient (the first layer, an embedding) stays
"open" in the backward until `close_backward()`; modules that run inside a checkpointed
region's recomputation are reported as forward modules of the backward phase.
"""

from __future__ import annotations

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._pytree import tree_leaves


class ModuleScope:
    """Tracks the innermost running module by its qualified name; see the module docstring."""

    def __init__(self, model: torch.nn.Module):
        self.names = {id(m): name for name, m in model.named_modules()}
        self._forward: list[str] = []
        self._backward: list[str] = []
        self._handles: list = []
        self._grad_handles: list = []

    def current(self) -> str:
        if self._forward:
            return self._forward[-1]
        if self._backward:
            return self._backward[-1]
        return ""

    def name_of(self, module: torch.nn.Module) -> str:
        return self.names.get(id(module)) or type(module).__name__

    def close_backward(self) -> None:
        """Forget every module still open in the backward (call when `backward()` returns)."""
        self._backward.clear()
        for handle in self._grad_handles:
            handle.remove()
        self._grad_handles.clear()

    # -- hooks --------------------------------------------------------------------------------
    # Plain tensor hooks that keep no reference to the gradient they see (torch's multi-grad
    # hooks buffer gradients until every one has arrived, which would change the memory measured).
    def _pre(self, module: torch.nn.Module, args) -> None:
        name = self.name_of(module)
        self._forward.append(name)
        if _recording_graph():
            for tensor in _grad_tensors(args):
                self._grad_handles.append(tensor.register_hook(self._exit_backward(name)))

    def _post(self, module: torch.nn.Module, args, output) -> None:
        name = self.name_of(module)
        if self._forward and self._forward[-1] == name:
            self._forward.pop()
        elif name in self._forward:
            self._forward.remove(name)
        if _recording_graph():
            for tensor in _grad_tensors(output):
                self._grad_handles.append(tensor.register_hook(self._enter_backward(name)))

    def _enter_backward(self, name: str):
        def hook(_grad: torch.Tensor) -> None:
            if not self._backward or self._backward[-1] != name:
                self._backward.append(name)

        return hook

    def _exit_backward(self, name: str):
        def hook(_grad: torch.Tensor) -> None:
            for i in range(len(self._backward) - 1, -1, -1):
                if self._backward[i] == name:
                    del self._backward[i]
                    break

        return hook

    def __enter__(self) -> ModuleScope:
        self._handles = [
            register_module_forward_pre_hook(self._pre),
            register_module_forward_hook(self._post, always_call=True),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.close_backward()
        self._forward.clear()


def _recording_graph() -> bool:
    """True in a forward that builds an autograd graph (not under no_grad, not a recomputation in backward)."""
    return torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1


def _grad_tensors(obj) -> list[torch.Tensor]:
    return [t for t in tree_leaves(obj) if isinstance(t, torch.Tensor) and t.requires_grad]

"""Pass 2: find the op and module that create the first NaN/Inf, and where the graph was cut.

Only run when pass 1 saw a problem; it is slow on purpose (every torch call is inspected):

    tracer = OpTracer(model, cwd, watch_values=True, watch_cuts=False, watch_nodes=True)
    with tracer:
        output = model(batch)
        tracer.phase = "loss"
        loss = loss_fn(output, batch)
    tracer.origin_of(loss)                      # NonfiniteLocation of the op that made the NaN
    with BackwardWatch(loss, tracer) as watch:
        loss.backward()
    watch.location                              # first autograd node that turned finite grads non-finite

Forward: a TorchFunctionMode sees every torch function, Tensor method and nn.functional call.
Each non-finite tensor gets an origin: the op that produced it when all of that op's other inputs
were finite (the creator), or else the origin of the non-finite input it came from. Following
origins rather than taking the first non-finite op ignores values that are meant to be infinite
and get absorbed again, such as -inf attention masks before a softmax. Forward hooks keep a module
stack, so every op is attributed to the innermost module running it.

Backward: hooks on every autograd node of the loss's graph (what anomaly mode checks, but here
the node is tied back to the module and source line that created it in forward): the first node
whose incoming gradient is finite and whose outgoing gradient is not created the NaN/Inf.

Known limitations: work done outside torch functions (numpy, C extensions writing into tensor
memory) is invisible to the trace; the module-level fallback then names the innermost module
whose output was non-finite while its inputs were finite. Dropout masks are reproduced by reseeding,
but nondeterministic CUDA kernels may not reproduce a borderline overflow.
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from torch_skills.gradients.causes import backward_cause, operand_cause
from torch_skills.gradients.models import NonfiniteLocation
from torch_skills.gradients.tensors import checkable, dtype_name, is_finite, kind_of, tensors_in, user_source

# Calls that return values cut from the autograd graph.
CUT_OPS = frozenset({"detach", "detach_", "data", "item", "tolist", "numpy"})
# Factories of uninitialized memory: garbage NaNs there are not the user's computation.
UNINITIALIZED_OPS = frozenset({"empty", "empty_like", "new_empty", "empty_strided"})
MAX_CUTS = 50


def op_name(func: Any) -> str:
    """'log', 'div', 'linear'; 'data' / 'shape' for property getters."""
    name = getattr(func, "__name__", None) or repr(func)
    if name == "__get__":
        owner = getattr(func, "__self__", None)
        name = getattr(owner, "__name__", name)
    return name


def _is_inplace(name: str) -> bool:
    return (name.endswith("_") and not name.endswith("__")) or name == "__setitem__"


@dataclass
class GraphCut:
    """A call that cut a value out of the graph: where, and what it cut."""

    op: str
    module: str | None
    source: str | None
    node: Any  # grad_fn of the tensor that was cut, or the leaf tensor itself


class OpTracer(TorchFunctionMode):
    """Forward-pass tracer (see the module docstring)."""

    def __init__(
        self, model: nn.Module, cwd: Path, *, watch_values: bool, watch_cuts: bool, watch_nodes: bool
    ):
        super().__init__()
        self.model = model
        self.cwd = cwd
        self.watch_values = watch_values
        self.watch_cuts = watch_cuts
        self.watch_nodes = watch_nodes
        self.phase = "forward"
        self.first_created: NonfiniteLocation | None = None
        self.module_fallback: NonfiniteLocation | None = None
        self.cuts: list[GraphCut] = []
        self.owners: dict[int, tuple[Any, str | None, str | None]] = {}  # id(node) -> (node, module, source)
        self._origins: dict[int, tuple[weakref.ref, NonfiniteLocation]] = {}
        self._stack: list[tuple[str, str]] = []  # (qualified name, class name) of running modules
        self._names = {id(m): (n, type(m).__name__) for n, m in model.named_modules()}
        self._handles: list[Any] = []
        self._busy = False

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> OpTracer:
        for module in self.model.modules():
            try:
                self._handles.append(module.register_forward_pre_hook(self._push))
                self._handles.append(module.register_forward_hook(self._pop))
            except (RuntimeError, AttributeError):
                continue
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()

    def release(self) -> None:
        """Drop the references to graph nodes (and through them, saved activations)."""
        self.owners.clear()
        self.cuts.clear()
        self._origins.clear()

    # -- origins --------------------------------------------------------------------------------
    def mark(self, t: torch.Tensor, location: NonfiniteLocation) -> None:
        """Give a tensor a known origin (used for the input batch)."""
        self._origins[id(t)] = (weakref.ref(t), location)

    def origin_of(self, obj: Any) -> NonfiniteLocation | None:
        """Origin of the first non-finite tensor in `obj`, None when all are finite or untraced."""
        for t in tensors_in(obj):
            known = self._known_origin(t)
            if known is not None:
                return known
        return None

    def _known_origin(self, t: torch.Tensor) -> NonfiniteLocation | None:
        entry = self._origins.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        return None

    @property
    def module(self) -> tuple[str, str] | None:
        return self._stack[-1] if self._stack else None

    # -- module stack ---------------------------------------------------------------------------
    def _push(self, module: nn.Module, args: Any) -> None:
        self._stack.append(self._names.get(id(module), ("?", type(module).__name__)))

    def _pop(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            name, type_name = self._stack.pop()
            if self.watch_values and self.module_fallback is None and not self._busy:
                self._busy = True
                try:
                    self._check_module(name, type_name, args, output)
                finally:
                    self._busy = False

    def _check_module(self, name: str, type_name: str, args: Any, output: Any) -> None:
        bad = [t for t in tensors_in(output) if checkable(t) and not is_finite(t)]
        if bad and all(is_finite(t) for t in tensors_in(args)):
            self.module_fallback = NonfiniteLocation(
                phase="forward",
                module=name,
                module_type=type_name,
                inputs_finite=True,
                kind=kind_of(bad[0]),
                dtype=dtype_name(bad[0]),
                located_by="module_hooks",
            )

    # -- every torch call -----------------------------------------------------------------------
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._busy:
            return out
        self._busy = True
        try:
            self._after(op_name(func), args, kwargs, out)
        finally:
            self._busy = False
        return out

    def _after(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        touched = tensors_in(out)
        if _is_inplace(name) and args and isinstance(args[0], torch.Tensor):
            touched.append(args[0])
        if self.watch_cuts and name in CUT_OPS and args and isinstance(args[0], torch.Tensor):
            self._record_cut(name, args[0])
        if self.watch_nodes:
            self._record_owners(touched)
        if self.watch_values and name not in UNINITIALIZED_OPS:
            for t in touched:
                if checkable(t) and self._known_origin(t) is None and not is_finite(t):
                    self._assign_origin(name, t, args, kwargs)

    def _record_cut(self, name: str, t: torch.Tensor) -> None:
        if not t.requires_grad or len(self.cuts) >= MAX_CUTS:
            return
        module = self.module
        self.cuts.append(
            GraphCut(
                name, module[0] if module else None, user_source(self.cwd), t.grad_fn if t.grad_fn else t
            )
        )

    def _record_owners(self, touched: list[torch.Tensor]) -> None:
        source: str | None = None
        for t in touched:
            node = t.grad_fn
            if node is not None and id(node) not in self.owners:
                if source is None:
                    source = user_source(self.cwd)
                module = self.module
                self.owners[id(node)] = (node, module[0] if module else None, source)

    def _assign_origin(self, name: str, t: torch.Tensor, args: tuple, kwargs: dict) -> None:
        others = [x for x in tensors_in((args, kwargs)) if x is not t]
        for x in others:
            inherited = self._known_origin(x)
            if inherited is not None and not is_finite(x):  # it may have been repaired in place since
                self.mark(t, inherited)
                return
        module = self.module
        inputs_finite = all(is_finite(x) for x in others)
        cause, fix = operand_cause(name, args, kwargs) if inputs_finite else (None, None)
        location = NonfiniteLocation(
            phase=self.phase if module is None else "forward",  # type: ignore[arg-type]
            module=module[0] if module else None,
            module_type=module[1] if module else None,
            op=name,
            inputs_finite=inputs_finite,
            cause=cause,
            fix=fix,
            kind=kind_of(t),
            dtype=dtype_name(t),
            source=user_source(self.cwd),
            located_by="op_trace",
        )
        self.mark(t, location)
        if self.first_created is None:
            self.first_created = location

    # -- graph cuts -----------------------------------------------------------------------------
    def cut_reaching(self, params: list[nn.Parameter]) -> GraphCut | None:
        """The first recorded cut whose cut-off graph leads back to one of `params`."""
        wanted = {id(p) for p in params}
        for cut in self.cuts:
            if isinstance(cut.node, torch.Tensor):
                if id(cut.node) in wanted:
                    return cut
                continue
            if _graph_reaches(cut.node, wanted):
                return cut
        return None


def _graph_reaches(root: Any, leaf_ids: set[int]) -> bool:
    seen: set[int] = set()
    queue = deque([root])
    while queue:
        node = queue.popleft()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)  # AccumulateGrad nodes hold their leaf
        if variable is not None and id(variable) in leaf_ids:
            return True
        queue.extend(n for n, _ in node.next_functions)
    return False


def graph_nodes(root: Any) -> tuple[list[Any], dict[int, Any]]:
    """Every node reachable from `root` (breadth first) and, for each, the node that first led to it."""
    nodes: list[Any] = []
    parent: dict[int, Any] = {}
    seen: set[int] = set()
    queue = deque([(root, None)])
    while queue:
        node, came_from = queue.popleft()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        if came_from is not None:
            parent[id(node)] = came_from
        queue.extend((n, node) for n, _ in node.next_functions)
    return nodes, parent


class BackwardWatch:
    """Hooks on every autograd node of `loss`'s graph; `location` is the first that made a NaN/Inf."""

    def __init__(self, loss: torch.Tensor, tracer: OpTracer):
        self.loss = loss
        self.tracer = tracer
        self.location: NonfiniteLocation | None = None
        self._parent: dict[int, Any] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> BackwardWatch:
        nodes, self._parent = graph_nodes(self.loss.grad_fn)
        for node in nodes:
            self._handles.append(node.register_hook(self._hook_for(node)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook_for(self, node: Any):
        def hook(grad_inputs: tuple, grad_outputs: tuple) -> None:
            if self.location is not None:
                return
            bad = [g for g in grad_inputs if g is not None and checkable(g) and not is_finite(g)]
            if bad:
                self.location = self._locate(
                    node, bad[0], all(is_finite(g) for g in grad_outputs if g is not None)
                )

        return hook

    def _locate(self, node: Any, grad: torch.Tensor, incoming_finite: bool) -> NonfiniteLocation:
        module, source = None, None
        current: Any = node
        while current is not None:  # nodes made inside a composite op belong to the op that used them
            owner = self.tracer.owners.get(id(current))
            if owner is not None:
                module, source = owner[1], owner[2]
                break
            current = self._parent.get(id(current))
        type_name = None
        if module is not None:
            for name, m in self.tracer.model.named_modules():
                if name == module:
                    type_name = type(m).__name__
                    break
        cause, fix = backward_cause(node) if incoming_finite else (None, None)
        return NonfiniteLocation(
            phase="backward",
            module=module,
            module_type=type_name,
            op=node.name(),
            autograd_node=node.name(),
            inputs_finite=incoming_finite,
            cause=cause,
            fix=fix,
            kind=kind_of(grad),
            dtype=dtype_name(grad),
            source=source,
            located_by="autograd_hooks",
        )

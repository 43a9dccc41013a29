"""A log of every tensor storage that lives and dies while a step runs, fake or real.

Use it as a context manager around the code to measure:

    ledger = StorageLedger(scope)                   # scope: a ModuleScope, or None
    ledger.adopt(param, "parameter")                # storages that exist before the step
    with ledger:
        ledger.phase("forward")
        loss = model(x).mean()                      # every op output is recorded
        ...
    ledger.events                                   # [(ALLOC, rec) | (FREE, rec) | (OP, Sample) | (PHASE, name)]

It is a TorchDispatchMode: after each aten op it records the *storages* of the outputs it has
not seen before (views share a storage, so each storage counts once, by its `nbytes()`), and a
weakref finalizer on each storage's Python object records the moment it dies. It never keeps a
storage alive. Each storage gets a `StorageRecord` whose `kind` can be upgraded after the fact
(a temporary that `AccumulateGrad` keeps as `.grad` becomes a gradient, a tensor packed for
backward becomes an activation), so the whole timeline is classified with final kinds when it is
replayed (`torch_skills.memory.timeline`).

Known limitations: `UntypedStorage.resize_` (FSDP's trick for freeing parameter memory) is not
an aten op and is not seen; memory a kernel allocates for itself inside one op is invisible,
except for the kernels a `KernelProbe` measures (convolutions and RNNs, `torch_skills.memory.probes`:
on fake tensors from a probe run, on real CPU tensors from the op's own run), the CUDA kernels a
`CudaKernelModel` sizes from shapes (`torch_skills.memory.cudakernels`) and, on a real CUDA step,
the workspace a `CudaScratchMeter` measures around every op; all are recorded as temporaries
alive during the op (`StorageRecord.scratch`); sparse and wrapper-subclass
tensors are skipped.

Gradient accumulation in backward: the autograd engine sums two gradients that flow into the same
input (a tensor used twice) with `old + new`, and without a dispatch mode it does that in place
(`old.add_(new)`) when it holds the last reference to `old`. Any TorchDispatchMode, this ledger
included, makes the engine take the out-of-place path (`isTensorSubclassLike` is true while a mode
is active), so the step under the ledger holds one more gradient-sized buffer than the real step.
`watch_backward(loss)` marks, with hooks on the graph's nodes, the stretch between a node's return
and the next node's start, where the engine sums into its input buffers; an `add` there whose first
operand dies as soon as it returns is recorded as the in-place sum the real engine does (+4.9% -> 0.0%
on a small Mamba's selective scan, whose per-step slices of one tensor each send a gradient back).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

# Event tags in StorageLedger.events.
ALLOC, FREE, OP, PHASE = "alloc", "free", "op", "phase"

# Classification, strongest first: a storage's kind only ever moves to a stronger one.
KIND_RANK = {
    "parameter": 0,
    "buffer": 1,
    "input": 2,
    "gradient": 3,
    "optimizer_state": 4,
    "activation": 5,
    "temporary": 6,
}


@dataclass(eq=False)
class StorageRecord:
    """One storage: its size, what it is, where it was created and which module saved it."""

    rid: int
    nbytes: int
    kind: str
    phase: str
    module: str
    saved_by: str | None = None  # module (fqn) that packed it for backward, when it is an activation
    scratch: bool = False  # a kernel's own scratch, measured by a KernelProbe (not a tensor storage)

    def promote(self, kind: str) -> None:
        if KIND_RANK[kind] < KIND_RANK[self.kind]:
            self.kind = kind


@dataclass(frozen=True)
class Sample:
    """The point right after one op: where it ran (phase, innermost module) and what it was."""

    index: int
    op: str
    phase: str
    module: str


class StorageLedger(TorchDispatchMode):
    """Records storage births and deaths around every aten op; see the module docstring."""

    def __init__(self, scope: Any = None, probe: Any = None, kernels: Any = None, meter: Any = None):
        super().__init__()
        self.scope = scope  # a ModuleScope (torch_skills.memory.modules) or None
        self.probe = probe  # a KernelProbe (torch_skills.memory.probes) or None
        self.kernels = kernels  # a CudaKernelModel (torch_skills.memory.cudakernels) or None
        self.meter = meter  # a CudaScratchMeter (torch_skills.memory.probes) on a real CUDA step, or None
        self.events: list[tuple[str, Any]] = []
        self.current_phase = "setup"
        self._live: dict[int, tuple[weakref.ref, StorageRecord]] = {}
        self._next_rid = 0
        self._ops = 0
        self.recording = False  # frees after the step ends are not part of it
        self._summing = False  # between a backward node's return and the next node's start
        self._in_place_sum: tuple[int, StorageRecord, StorageRecord] | None = None  # see _sum_in_place

    def __enter__(self):
        self.recording = True
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self.recording = False

    # -- what the driver calls ----------------------------------------------------------------
    def phase(self, name: str) -> None:
        """Start a phase ('forward', 'backward', 'optimizer_step'); samples carry its name."""
        self.current_phase = name
        self._summing = False  # a backward pass has ended (or not begun)
        self.events.append((PHASE, name))

    def adopt(self, tensor: torch.Tensor, kind: str) -> StorageRecord | None:
        """Record a storage that already exists (parameters, inputs, optimizer state) with a kind."""
        rec = self._track(tensor)
        if rec is not None:
            rec.promote(kind)
        return rec

    def classify(self, tensor: torch.Tensor, kind: str, saved_by: str | None = None) -> None:
        """Upgrade the kind of a tracked storage (e.g. a temporary that became `.grad`)."""
        rec = self.record_of(tensor)
        if rec is None:
            rec = self._track(tensor)
        if rec is None:
            return
        rec.promote(kind)
        if saved_by is not None and rec.saved_by is None and rec.kind == "activation":
            rec.saved_by = saved_by

    def watch_backward(self, root: torch.Tensor) -> None:
        """Hook every node of `root`'s graph so the engine's gradient sums are recorded as in place.

        Call it after the forward pass, before `root.backward()` (see the module docstring).
        """

        def start(*_):
            self._summing = False

        def done(*_):
            self._summing = True

        seen: dict[int, Any] = {}  # id -> node, kept alive so that no id is reused by another node's wrapper
        stack = [root.grad_fn] if root.grad_fn is not None else []
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen[id(node)] = node
            node.register_prehook(start)
            if node.next_functions:  # AccumulateGrad has none; a post hook would change its stealing rule
                node.register_hook(done)
            stack.extend(nxt for nxt, _ in node.next_functions if nxt is not None)

    def record_of(self, tensor: torch.Tensor) -> StorageRecord | None:
        storage = _storage_of(tensor)
        if storage is None:
            return None
        entry = self._live.get(id(storage))
        return entry[1] if entry is not None and entry[0]() is storage else None

    # -- TorchDispatchMode --------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._in_place_sum = None  # another op ran: the previous sum's operand outlived it
        if self.meter is not None:
            self.meter.start()
        found = None
        if self.probe is not None and self.probe.measures_calls(func) and not _is_fake((args, kwargs)):
            out, found = self.probe.call(func, args, kwargs)  # a real step: measure the kernel's own run
        else:
            out = func(*args, **kwargs)
            if self.probe is not None and self.probe.wants(func) and _is_fake(out):
                found = self.probe.measure(func, args, kwargs)
                if found is not None:
                    out = _with_true_sizes(out, found.output_numels)
        measured = self.meter.stop() if self.meter is not None else 0
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf)
        name = str(func.overloadpacket.__name__)
        scratch = []
        if found is not None and found.scratch_bytes > 0 and self.probe.scratch:
            scratch.append(found.scratch_bytes)
        if self.meter is not None:  # a real CUDA op: its workspace is measured, not modelled
            scratch += [measured] if measured > 0 else []
        elif self.kernels is not None:
            scratch += self.kernels.scratch(func, args, kwargs)
        if scratch:
            records = [self._new_record(nbytes, "temporary") for nbytes in scratch]
            for rec in records:
                rec.scratch = True
            self.events.extend((ALLOC, rec) for rec in records)
            self._sample(f"{name} (kernel scratch)")
            self.events.extend((FREE, rec) for rec in records)
        self._sample(name)
        # with grad mode on (create_graph=True) the engine sums out of place too
        if self._summing and func is torch.ops.aten.add.Tensor and not torch.is_grad_enabled():
            self._expect_in_place_sum(args, out)
        return out

    def _expect_in_place_sum(self, args, out) -> None:
        """Remember a gradient sum `old + new` the real engine would do in place (module docstring).

        It qualifies when `old` is a plain dense tensor of the result's shape and dtype, alone on its
        storage; whether the engine held its last reference shows when it dies before the next op.
        """
        old = args[0] if args else None
        if not isinstance(old, torch.Tensor) or not isinstance(out, torch.Tensor) or len(args) != 2:
            return
        if not isinstance(args[1], torch.Tensor) or args[1].layout is not torch.strided:
            return
        if old.shape != out.shape or old.dtype != out.dtype or not _dense(old):
            return
        old_rec, out_rec = self.record_of(old), self.record_of(out)
        if old_rec is None or out_rec is None or old_rec is out_rec or old_rec.nbytes != out_rec.nbytes:
            return
        for index in range(len(self.events) - 1, -1, -1):
            if self.events[index] == (ALLOC, out_rec):
                self._in_place_sum = (index, old_rec, out_rec)
                return

    def _sum_in_place(self, rec: StorageRecord) -> bool:
        """`rec` died right after the sum that used it: move the sum's allocation after its death."""
        pending = self._in_place_sum
        if pending is None or pending[1] is not rec:
            return False
        self._in_place_sum = None
        index, old_rec, out_rec = pending
        del self.events[index]
        self.events.extend([(FREE, old_rec), (ALLOC, out_rec)])
        return True

    def _sample(self, name: str) -> None:
        module = self.scope.current() if self.scope is not None else ""
        self.events.append((OP, Sample(self._ops, name, self.current_phase, module)))
        self._ops += 1

    # -- bookkeeping --------------------------------------------------------------------------
    def _track(self, tensor: torch.Tensor) -> StorageRecord | None:
        storage = _storage_of(tensor)
        if storage is None:
            return None
        key = id(storage)
        entry = self._live.get(key)
        if entry is not None and entry[0]() is storage:
            rec = entry[1]
            if storage.nbytes() != rec.nbytes:  # resized in place through an aten op (`out=`, resize_)
                self.events.append((FREE, rec))
                rec = self._new_record(storage.nbytes(), rec.kind)
                self._live[key] = (entry[0], rec)
                self._watch(storage, key, rec)
                self.events.append((ALLOC, rec))
            return rec
        rec = self._new_record(storage.nbytes(), "temporary")
        self._watch(storage, key, rec)
        self.events.append((ALLOC, rec))
        return rec

    def _new_record(self, nbytes: int, kind: str) -> StorageRecord:
        module = self.scope.current() if self.scope is not None else ""
        rec = StorageRecord(self._next_rid, nbytes, kind, self.current_phase, module)
        self._next_rid += 1
        return rec

    def _watch(self, storage: torch.UntypedStorage, key: int, rec: StorageRecord) -> None:
        events, live = self.events, self._live

        def died(ref: weakref.ref, rec: StorageRecord = rec) -> None:
            if self.recording and not self._sum_in_place(rec):
                events.append((FREE, rec))
            current = live.get(key)
            if current is not None and current[1] is rec:
                del live[key]

        self._live[key] = (weakref.ref(storage, died), rec)


def _dense(t: torch.Tensor) -> bool:
    """A strided tensor that fills its storage exactly, in some order of its dimensions."""
    if t.layout is not torch.strided or is_traceable_wrapper_subclass(t):
        return False
    storage = _storage_of(t)
    if storage is None or storage.nbytes() != t.numel() * t.element_size():
        return False
    return is_non_overlapping_and_dense_or_false(t)


def _is_fake(out: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(leaf, FakeTensor) for leaf in tree_leaves(out))


def _with_true_sizes(out: Any, numels: tuple[int, ...]) -> Any:
    """Replace empty fake outputs that are not empty for real (RNN workspaces) by fake ones of the true size."""
    leaves = [leaf for leaf in tree_leaves(out) if isinstance(leaf, torch.Tensor)]
    if not isinstance(out, tuple) or len(leaves) != len(out) or len(numels) != len(out):
        return out
    fixed = []
    for tensor, numel in zip(out, numels, strict=True):
        if tensor.numel() == 0 and numel > 0:
            tensor = torch.empty(
                numel, dtype=tensor.dtype, device=tensor.device
            )  # (N,), fake under the fake mode
        fixed.append(tensor)
    return tuple(fixed)


def _storage_of(tensor: torch.Tensor) -> torch.UntypedStorage | None:
    if tensor.layout is not torch.strided or is_traceable_wrapper_subclass(tensor):
        return None
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # no storage (e.g. a functional wrapper)
        return None

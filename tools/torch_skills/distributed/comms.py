"""Record every collective a rank makes: op, shapes, dtype, bytes and the user's call site.

Use inside a rank, after init_process_group and before the user's code is imported:

    rec = Recorder(log_path)          # one JSON line per collective, flushed before the call runs
    with rec.installed():             # wraps torch.distributed's collective functions
        rec.step = 1
        ...
    rec.counts(1)                     # {"all_reduce": CollectiveCount(...), ...}

The line is written before the call blocks, so a rank stuck in a collective leaves its last call
on disk for the supervisor. DDP's gradient buckets are reduced from C++ and never reach these
functions: `ddp_counting_hook` is a comm hook that records each bucket, then all-reduces and
averages it as DDP's default does.

Known limitations: collectives made from C++ without a hook (DDP's construction-time broadcast,
the unused-parameter map of find_unused_parameters=True) are not seen.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from torch_skills import OWN_DIRS

# name -> kind it is counted under
WRAPPED = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
    "all_gather_object": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "broadcast": "broadcast",
    "broadcast_object_list": "broadcast",
    "reduce": "reduce",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "send": "p2p",
    "recv": "p2p",
}
_TORCH_DIR = os.path.dirname(torch.__file__)


def call_site() -> str | None:
    """'file.py:42' of the innermost frame outside torch and torch_skills, or None."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename
        if name.startswith(_TORCH_DIR) or name.startswith(OWN_DIRS) or name.startswith("<"):
            continue
        return f"{name}:{frame.lineno}"
    return None


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found += [v for v in value if isinstance(v, torch.Tensor)]
    return found


class Recorder:
    """Counts and logs collectives per step; see the module docstring."""

    def __init__(self, log_path: str):
        self._log = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the rank
        self.step = 0  # 0: set-up (wrapping, probe); steps count from 1
        self.seq = 0
        self.paused = False  # the tool's own bookkeeping collectives are not the user's
        self._counts: dict[int, dict[str, list[int]]] = {}
        self.buckets: list[dict[str, Any]] = []  # DDP's buckets as step 1 saw them (after its rebuild)

    def record(self, op: str, kind: str, tensors: list[torch.Tensor], where: str | None) -> None:
        if self.paused:
            return
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        entry = {
            "seq": self.seq,
            "step": self.step,
            "op": op,
            "shapes": [list(t.shape) for t in tensors][:4],
            "dtype": str(tensors[0].dtype).removeprefix("torch.") if tensors else None,
            "bytes": nbytes,
            "where": where,
        }
        self.seq += 1
        slot = self._counts.setdefault(self.step, {}).setdefault(kind, [0, 0])
        slot[0] += 1
        slot[1] += nbytes
        self._log.write(json.dumps(entry) + "\n")  # line-buffered: on disk before the call blocks

    def counts(self, step: int) -> dict[str, tuple[int, int]]:
        return {k: (v[0], v[1]) for k, v in self._counts.get(step, {}).items()}

    @contextlib.contextmanager
    def installed(self) -> Iterator[Recorder]:
        """Wrap torch.distributed's collectives (module attributes, so FSDP2 and user code see them)."""
        originals: dict[str, Any] = {}
        c10d = sys.modules["torch.distributed.distributed_c10d"]
        for name, kind in WRAPPED.items():
            original = getattr(dist, name, None)
            if original is None:
                continue
            originals[name] = original

            def wrapper(*args, _original=original, _name=name, _kind=kind, **kwargs):
                self.record(_name, _kind, _tensors(args, kwargs), call_site())
                return _original(*args, **kwargs)

            setattr(dist, name, wrapper)
            if getattr(c10d, name, None) is original:
                setattr(c10d, name, wrapper)
        try:
            yield self
        finally:
            for name, original in originals.items():
                setattr(dist, name, original)
                setattr(c10d, name, original)

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """The tool's own collectives inside: not logged, not counted."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False


def ddp_counting_hook(recorder, bucket):  # no annotations: DDP checks them against dist.GradBucket
    """DDP comm hook: record the bucket, all-reduce it, divide by world size (DDP's default result)."""
    tensor = bucket.buffer()
    if recorder.step == 1:
        recorder.buckets.append(
            {
                "index": bucket.index(),
                "bytes": tensor.numel() * tensor.element_size(),
                "parameters": len(bucket.parameters()),
                "names": [id(p) for p in bucket.parameters()],
            }
        )
    recorder.record("all_reduce", "all_reduce", [tensor], f"DDP gradient bucket {bucket.index()}")
    world = dist.get_world_size()
    with recorder.quiet():
        work = dist.all_reduce(tensor, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0].div_(world))

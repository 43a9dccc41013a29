"""Replay a ledger's events into the memory timeline: the peak, where it happened, what it held.

Use:

    replay = replay_events(trace.events, cuda=True, capacity_bytes=80 * 2**30)
    replay.peak.total, replay.peak.by_category, replay.peak.phase, replay.peak.module
    replay.peak.scratch     # the part of the peak that is kernel scratch, not tensor storage
    replay.peak_reserved, replay.peak_tensor_bytes, replay.saved_by_module

Every storage is classified by its final kind (see `torch_skills.memory.ledger`), so a temporary that
ended up as a gradient counts as a gradient at every moment it was alive. With `cuda=True` each
storage counts as the block the CUDA caching allocator would hand out (`torch_skills.memory.allocator`)
and the allocator's reserved bytes are tracked too; with `cuda=False` it counts its exact bytes.
The running totals are sampled after every op and at every phase boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch_skills.memory.allocator import CachingAllocatorModel
from torch_skills.memory.ledger import ALLOC, FREE, OP, PHASE, Sample, StorageRecord

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "other")
KIND_TO_CATEGORY = {
    "parameter": "parameters",
    "buffer": "other",
    "input": "other",
    "gradient": "gradients",
    "optimizer_state": "optimizer_state",
    "activation": "activations",
    "temporary": "temporaries",
}


@dataclass
class PeakPoint:
    """The moment of the peak: the total, its split by category, and where the step was."""

    total: int = 0
    by_category: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    phase: str = "setup"
    module: str = ""
    op: str = ""
    op_index: int = -1
    scratch: int = 0  # of `total`, kernel scratch (StorageRecord.scratch): not tensor storage


@dataclass
class Replay:
    peak: PeakPoint  # by allocated bytes (CUDA blocks when cuda=True, exact bytes otherwise)
    peak_tensor_bytes: int  # the peak of exact storage bytes, whatever the allocator
    peak_reserved: int | None  # the CUDA allocator's reserved bytes at their peak (cuda=True only)
    phase_peaks: dict[str, int]
    saved_by_module: dict[str, int]  # activation bytes saved for backward, by the module that saved them
    activation_bytes: int  # activations alive when the first forward pass ended
    oom: bool = False  # the allocator model ran out of `capacity_bytes`


def replay_events(events: list, *, cuda: bool, capacity_bytes: int | None = None) -> Replay:
    """Walk the events once; see the module docstring."""
    sim = CachingAllocatorModel(capacity_bytes) if cuda else None
    counted: dict[StorageRecord, int] = {}
    totals = dict.fromkeys(CATEGORIES, 0)
    total = raw = peak_raw = scratch = 0
    peak = PeakPoint()
    phase_peaks: dict[str, int] = {}
    phase, module, op, op_index = "setup", "", "", -1
    forward_passes = 0
    first_forward: list[StorageRecord] = []
    activation_bytes = None

    def sample() -> None:
        nonlocal peak
        if total > peak.total or peak.op_index < 0:
            peak = PeakPoint(total, dict(totals), phase, module, op, op_index, scratch)
        if phase not in ("setup", "end"):
            phase_peaks[phase] = max(phase_peaks.get(phase, 0), total)

    for tag, value in events:
        if tag == ALLOC:
            size = sim.malloc(value, value.nbytes) if sim is not None else value.nbytes
            counted[value] = size
            totals[KIND_TO_CATEGORY[value.kind]] += size
            total += size
            scratch += size if value.scratch else 0
            raw += value.nbytes
            peak_raw = max(peak_raw, raw)
            if phase == "forward" and forward_passes == 1:
                first_forward.append(value)
        elif tag == FREE:
            size = counted.pop(value, None)
            if size is None:
                continue
            if sim is not None:
                sim.free(value)
            totals[KIND_TO_CATEGORY[value.kind]] -= size
            total -= size
            scratch -= size if value.scratch else 0
            raw -= value.nbytes
        elif tag == OP:
            sample_point: Sample = value
            op, module, op_index = sample_point.op, sample_point.module, sample_point.index
            sample()
        elif tag == PHASE:
            if phase == "forward" and value != "forward" and activation_bytes is None:
                activation_bytes = sum(
                    size for rec, size in counted.items() if KIND_TO_CATEGORY[rec.kind] == "activations"
                )
            phase, module, op = value, "", ""
            if value == "forward":
                forward_passes += 1
            sample()

    saved: dict[str, int] = {}
    for rec in first_forward:
        if rec.kind == "activation":
            key = rec.saved_by or "(outside any module: loss, functional code)"
            saved[key] = saved.get(key, 0) + rec.nbytes
    return Replay(
        peak=peak,
        peak_tensor_bytes=peak_raw,
        peak_reserved=sim.peak_reserved if sim is not None else None,
        phase_peaks=phase_peaks,
        saved_by_module=saved,
        activation_bytes=activation_bytes or 0,
        oom=bool(sim is not None and sim.oom),
    )

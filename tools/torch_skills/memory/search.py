"""The largest batch size that fits: a linear guess from two traces, then confirmed by tracing.

Use:

    found = max_batch_size(evaluate, first=est_at_b0, capacity_bytes=cap, max_traces=8)
    found.batch_size, found.method, found.traced

`evaluate(b)` returns the Estimate at batch size b (one more trace). Memory grows about linearly
with the batch (activations and temporaries scale, weights and optimizer state do not), so two
points give a candidate: a doubling step from the requested batch (or a halving one when it
does not fit) measures the per-sample bytes, the line predicts the largest fitting batch, and
the candidate is traced, then sizes 1, 2, 4, ... away from it until one fits and the next does
not (the allocator rounds and some buffers do not scale, so the line is close but not exact);
a wide bracket is bisected. Every step is a full trace, and the answer is only ever a batch size
that was traced and fitted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch_skills.memory.estimate import Estimate

BATCH_LIMIT = 1 << 20  # no search beyond a million samples per step


@dataclass
class BatchSearch:
    batch_size: int | None  # None: could not be determined (see method)
    method: str
    traced: dict[int, int] = field(default_factory=dict)  # batch size -> device bytes needed


def max_batch_size(
    evaluate: Callable[[int], Estimate],
    first: Estimate,
    *,
    capacity_bytes: int,
    max_traces: int = 8,
) -> BatchSearch:
    """Search as the module docstring says; `first` is the estimate at the requested batch size."""
    b0 = first.batch_size
    if not b0:
        return BatchSearch(None, "the batch has no leading dimension to vary")
    known: dict[int, Estimate] = {b0: first}

    def fits(b: int) -> bool:
        if b not in known:
            known[b] = evaluate(b)
        return bool(known[b].fits)

    def traces_left() -> bool:
        return len(known) - 1 < max_traces

    b1 = b0 * 2 if first.fits else max(1, b0 // 2)
    if b1 == b0:  # b0 == 1 and it does not fit
        return _result(0, "batch size 1 does not fit", known)
    fits(b1)
    lo, hi = _bracket(known)

    slope = (known[b1].device_bytes - first.device_bytes) / (b1 - b0)
    if slope <= 0 and hi is None:
        return _result(None, "memory did not grow with the batch size between the traced sizes", known)
    interpolate = True
    while traces_left() and (hi is None or hi - lo > 1):
        width = None if hi is None else hi - lo
        probe = _next_probe(known, lo, hi, capacity_bytes, interpolate)
        if probe in known:
            break
        fitted = fits(probe)
        # the line is usually right to within a sample or two: check the neighbour on the far side at once
        neighbour = probe + 1 if fitted else probe - 1
        if (
            traces_left()
            and neighbour >= 1
            and neighbour not in known
            and (hi is None or lo < neighbour < hi)
        ):
            fits(neighbour)
        lo, hi = _bracket(known)
        # regula falsi can creep from one side: when a step did not halve the bracket, bisect next
        interpolate = width is None or hi is None or (hi - lo) * 2 <= width
    if lo == 0:
        return (
            _result(0, "batch size 1 does not fit", known)
            if 1 in known
            else _result(None, f"no traced batch size fits (smallest traced: {min(known)})", known)
        )
    exact = hi is not None and hi - lo == 1
    how = (
        f"linear per-sample growth from batch sizes {b0} and {b1}, confirmed by tracing: "
        f"{lo} fits{f' and {hi} does not' if hi is not None else ''}"
    )
    if not exact:
        how += f" (search stopped after {max_traces} traces; the true maximum may be larger)"
    return _result(lo, how, known)


def _next_probe(known: dict[int, Estimate], lo: int, hi: int | None, capacity: int, interpolate: bool) -> int:
    """The next batch size to trace: on the line through the bracket's ends (or the two largest sizes), else halfway."""
    sizes = sorted(known)
    if hi is None:  # everything traced fits: extrapolate from the two largest sizes (at most x8 further)
        a, b = sizes[-2], sizes[-1]
        ea, eb = known[a].device_bytes, known[b].device_bytes
        step = (eb - ea) / (b - a) if b != a else 0
        guess = b + int((capacity - eb) // step) if step > 0 else b * 2
        return max(b + 1, min(guess, b * 8, BATCH_LIMIT))
    if lo == 0 or not interpolate:
        return max(1, (lo + hi) // 2)
    e_lo, e_hi = known[lo].device_bytes, known[hi].device_bytes
    if e_hi <= e_lo:
        return (lo + hi) // 2
    guess = lo + int((capacity - e_lo) * (hi - lo) // (e_hi - e_lo))
    return min(max(guess, lo + 1), hi - 1)


def _bracket(known: dict[int, Estimate]) -> tuple[int, int | None]:
    """(largest fitting batch or 0, smallest non-fitting batch above it or None)."""
    lo = max((b for b, e in known.items() if e.fits), default=0)
    hi = min((b for b, e in known.items() if not e.fits and b > lo), default=None)
    return lo, hi


def _result(batch: int | None, method: str, known: dict[int, Estimate]) -> BatchSearch:
    return BatchSearch(batch, method, {b: e.device_bytes for b, e in sorted(known.items())})

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

from tools.memory.estimate import Estimate

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
    if slope > 0:
        anchor = known[lo] if lo else first
        guess = (lo or b0) + int((capacity_bytes - anchor.device_bytes) // slope)
        guess = max(1, min(guess, BATCH_LIMIT))
        if guess not in known and traces_left():
            fits(guess)
        lo, hi = _bracket(known)
        # gallop away from the guess in steps 1, 2, 4, ... until the bracket closes on both sides
        step = 1
        while traces_left() and (hi is None or hi - lo > 1):
            if hi is None or guess <= lo:  # the guess fits: walk up from the largest fitting size
                probe = min(lo + step, BATCH_LIMIT)
                if hi is not None and probe >= hi:
                    break
            else:  # the guess does not fit: walk down from the smallest failing size
                probe = hi - step
                if probe <= lo:
                    break
            if probe in known or probe < 1:
                break
            fits(probe)
            lo, hi = _bracket(known)
            step *= 2
    while hi is not None and hi - lo > 1 and traces_left():
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    if lo == 0:
        return _result(0, "batch size 1 does not fit", known) if 1 in known else _result(
            None, f"no traced batch size fits (smallest traced: {min(known)})", known
        )
    exact = hi is not None and hi - lo == 1
    how = (
        f"linear per-sample growth from batch sizes {b0} and {b1}, confirmed by tracing: "
        f"{lo} fits{f' and {hi} does not' if hi is not None else ''}"
    )
    if not exact:
        how += f" (search stopped after {max_traces} traces; the true maximum may be larger)"
    return _result(lo, how, known)


def _bracket(known: dict[int, Estimate]) -> tuple[int, int | None]:
    """(largest fitting batch or 0, smallest non-fitting batch above it or None)."""
    lo = max((b for b, e in known.items() if e.fits), default=0)
    hi = min((b for b, e in known.items() if not e.fits and b > lo), default=None)
    return lo, hi


def _result(batch: int | None, method: str, known: dict[int, Estimate]) -> BatchSearch:
    return BatchSearch(batch, method, {b: e.device_bytes for b, e in sorted(known.items())})

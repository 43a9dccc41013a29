"""Robust summaries of repeated timings (no torch).

Use `summarize([0.010, 0.011, 0.012, 0.030])` -> `Summary(median=0.0115, iqr=..., ...)`; `noisy` is
True when the interquartile range is above 10% of the median, the point where one run's figures
stop being comparable with another's.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

NOISY_IQR_FRACTION = 0.10  # IQR above 10% of the median: the convention torch.utils.benchmark warns at


@dataclass(frozen=True)
class Summary:
    median: float
    iqr: float
    min: float
    max: float
    n: int

    @property
    def noisy(self) -> bool:
        return self.median > 0 and self.iqr > NOISY_IQR_FRACTION * self.median


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), q in [0, 1]."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(values: Sequence[float]) -> Summary:
    """Median, interquartile range, extremes of a non-empty sequence."""
    if not values:
        raise ValueError("summarize needs at least one value")
    return Summary(
        median=statistics.median(values),
        iqr=quantile(values, 0.75) - quantile(values, 0.25),
        min=min(values),
        max=max(values),
        n=len(values),
    )

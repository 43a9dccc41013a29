"""The small MLP that bench/tool_overhead.py checks: 64 -> 128 -> 128 -> 10, batch of 32.

`build()` is the factory the tool calls; the cold baseline imports the same file.
"""

from __future__ import annotations

import torch
from torch import nn

IN_FEATURES, HIDDEN, CLASSES, BATCH = 64, 128, 10, 32


def build() -> nn.Module:
    return nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def make_inputs(batch_size: int = BATCH) -> torch.Tensor:
    return torch.randn(batch_size, IN_FEATURES, generator=torch.Generator().manual_seed(0))  # (B, 64)

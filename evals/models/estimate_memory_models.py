"""Models for estimate_memory's eval scenarios (evals/scenarios/estimate_memory.py).

Each factory is referenced as 'evals/models/estimate_memory_models.py:<name>'.
"""

from __future__ import annotations

import torch
from torch import nn


def linear_4096() -> nn.Module:
    """One nn.Linear(4096, 4096): 16,781,312 parameters, 67,125,248 bytes in fp32."""
    return nn.Linear(4096, 4096)


class Block(nn.Module):
    """A pre-norm residual MLP block: saves several (B, T, 4C) tensors for backward."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def deep_blocks(depth: int = 8, dim: int = 128) -> nn.Module:
    """Eight small blocks on long sequences: activations dwarf the 1.6M parameters."""
    return nn.Sequential(*(Block(dim) for _ in range(depth)))


def deep_inputs(batch_size: int = 32) -> torch.Tensor:
    return torch.randn(batch_size, 256, 128)  # (B, T, C)


def wide_stack() -> nn.Module:
    """Four 2048x2048 Linears (16.8M parameters) fed a tiny batch: optimizer state dominates."""
    return nn.Sequential(*(nn.Linear(2048, 2048) for _ in range(4)))


class ReadsBack(nn.Module):
    """Calls .item() in forward: fake tensors cannot trace it, so the tool measures real runs."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        scale = 1.0 if h.abs().max().item() < 1e6 else 0.5
        return h * scale


def reads_back() -> nn.Module:
    return ReadsBack()

"""Models for profile_model's scenarios, each bound by a known resource by construction.

Use them as `evals/models/profile_model_scenarios.py:tiny_ops` and so on (paths relative to the
repository root). Sizes are chosen so that every scenario runs in a few seconds on 2 CPU cores.
"""

from __future__ import annotations

import time

import torch
from torch import nn

LOADER_SLEEP_S = 0.1  # per batch: 100x the model's step on a quiet machine, >3x on a very busy one


class SleepyLoader:
    """Re-iterable like a DataLoader; every batch takes LOADER_SLEEP_S to 'load'."""

    def __init__(self, batches: int = 8, batch_size: int = 32, features: int = 64):
        self.batches, self.batch_size, self.features = batches, batch_size, features

    def __iter__(self):
        gen = torch.Generator().manual_seed(0)
        for _ in range(self.batches):
            time.sleep(LOADER_SLEEP_S)
            yield torch.randn(self.batch_size, self.features, generator=gen)  # (B, F)


def sleepy_loader() -> SleepyLoader:
    return SleepyLoader()


def small_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def flops_mlp() -> nn.Module:
    """Linear(64, 128) -> ReLU -> Linear(128, 10): forward FLOPs are 2*B*64*128 + 2*B*128*10."""
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


class TinyOps(nn.Module):
    """Hundreds of elementwise ops on a (4, 16) tensor: each op is pure dispatch overhead."""

    def __init__(self, layers: int = 120, width: int = 16):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(layers, width))
        self.shift = nn.Parameter(torch.zeros(layers, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, width)
        for i in range(self.scale.shape[0]):
            x = torch.tanh(x * self.scale[i] + self.shift[i])
        return x


def tiny_ops() -> nn.Module:
    return TinyOps()


def big_matmul() -> nn.Module:
    """One (512, 1024) @ (1024, 1024) matmul per forward: about 1.07 GFLOP."""
    return nn.Linear(1024, 1024, bias=False)


class CheckedBlock(nn.Module):
    """A small layer that reads a value back every call, like a per-layer overflow check."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.linear(x))
        if x.abs().max().item() > 1e4:  # host sync: the value must reach Python
            x = x.clamp(-1e4, 1e4)
        return x


class SyncEveryLayer(nn.Module):
    def __init__(self, layers: int = 8, width: int = 32):
        super().__init__()
        self.blocks = nn.ModuleList(CheckedBlock(width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def sync_every_layer() -> nn.Module:
    return SyncEveryLayer()


class Elementwise(nn.Module):
    """Cheap elementwise ops on a large tensor: every op streams it through memory."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, N), 16 MiB for (64, 65536)
        for _ in range(4):
            x = torch.relu(x * 1.01 + 0.1)
            x = x.abs().neg()
        return x


def elementwise() -> nn.Module:
    return Elementwise()


def not_a_loader() -> int:
    return 42


class ValueLogger(nn.Module):
    """Reads its activations back as Python lists every call, the way ad-hoc logging does."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        self.last_values = y[0].tolist()  # host sync on a GPU, invisible to the dispatcher on a CPU
        return y


def value_logger() -> nn.Module:
    return ValueLogger()


class SequenceTagger(nn.Module):
    """A 2-layer LSTM over (B, T, 32) features and a per-step head: gate matmuls dominate the FLOPs."""

    def __init__(self, features: int = 32, hidden: int = 64, layers: int = 2, classes: int = 5):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, features)
        return self.head(self.lstm(x)[0])  # (B, T, classes)


def lstm_tagger() -> nn.Module:
    return SequenceTagger()


class GroupedMoE(nn.Module):
    """A top-2-of-4 SwiGLU MoE with experts as 3-D weights run by torch._grouped_mm (transformers 5's Mixtral)."""

    def __init__(self, dim: int = 64, hidden: int = 128, experts: int = 4, k: int = 2):
        super().__init__()
        self.router = nn.Linear(dim, experts, bias=False)
        self.gate_up = nn.Parameter(torch.randn(experts, dim, 2 * hidden) * dim**-0.5)  # (E, D, 2F)
        self.down = nn.Parameter(torch.randn(experts, hidden, dim) * hidden**-0.5)  # (E, F, D)
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, D)
        weights, chosen = torch.topk(torch.softmax(self.router(x), dim=-1), self.k, dim=-1)  # (N, k)
        order = chosen.flatten().argsort()  # token slots sorted by expert
        rows = x.index_select(0, order // self.k)  # (N*k, D)
        offs = torch.bincount(chosen.flatten(), minlength=self.gate_up.shape[0]).cumsum(0).to(torch.int32)
        gate, up = torch._grouped_mm(rows, self.gate_up, offs=offs).chunk(2, dim=-1)  # (N*k, F) each
        y = torch._grouped_mm(nn.functional.silu(gate) * up, self.down, offs=offs)  # (N*k, D)
        y = y * weights.flatten()[order, None]
        return torch.zeros_like(x).index_add_(0, order // self.k, y)


def grouped_moe() -> nn.Module:
    return GroupedMoE()

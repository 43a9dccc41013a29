"""Models for the check_distributed evals, written apart from the tool's tests: a torchvision-style
ResNet and a top-1 mixture of experts, each with the distributed bug a real project has (the Hugging
Face ones are in distributed_hf.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


# -- torchvision-style ResNet ------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class TinyResNet(nn.Module):
    def __init__(self, width: int = 8, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.layers = nn.ModuleList([BasicBlock(width), BasicBlock(width)])
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return self.fc(x.mean((2, 3)))


def resnet():
    return TinyResNet()


def image_batch(batch_size: int = 8):
    return torch.randn(batch_size, 3, 8, 8), torch.randint(0, 10, (batch_size,))


def accuracy_logging_loss(output, batch):
    """Cross-entropy, plus an accuracy all-reduced for the log, but only where the logging happens."""
    _, target = batch
    loss = F.cross_entropy(output, target)
    if dist.get_rank() == 0:
        correct = (output.argmax(1) == target).float().sum().reshape(1)
        dist.all_reduce(correct)
    return loss


# -- mixture of experts with top-1 routing -------------------------------------------------------------
class Top1MoE(nn.Module):
    def __init__(self, dim: int = 16, experts: int = 4):
        super().__init__()
        self.router = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        choice = self.router(x).argmax(-1)
        gate = self.router(x).softmax(-1).max(-1, keepdim=True).values
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            rows = choice == i
            if rows.any():  # an expert with no tokens on this rank is skipped
                out[rows] = expert(x[rows])
        return self.head(out * gate)


def moe():
    return Top1MoE()


def skewed_tokens(batch_size: int = 8):
    """Rank 0's rows and rank 1's rows come from different distributions (so different experts win)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(batch_size, 16, generator=g)
    x[: batch_size // 2] += 3.0
    x[batch_size // 2 :] -= 3.0
    return x

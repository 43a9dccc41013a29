"""A small decoder-only language model, healthy and buggy, for trying the torch-skills tools.

Point the tools at it, e.g. check_gradients(model="examples/tiny_lm.py:build_buggy",
inputs="examples/tiny_lm.py:make_inputs", loss="examples/tiny_lm.py:loss_fn").

`build()` is a clean GPT-style model (SDPA attention, pre-norm blocks, tied embeddings).
`build_buggy()` carries three bugs people really write:
- attention scores go through a hand-written softmax (exp / sum) without subtracting the max,
  and the query/key projections start with a large init: the exp overflows to inf, and inf/inf
  gives NaN in the first forward;
- a projection layer is created in __init__ but never used in forward (DDP's "parameters that
  did not receive gradient");
- the forward calls .item() on every block to log an activation norm: a host sync per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab_size: int = 512
    context: int = 64  # tokens per sequence
    width: int = 128  # model dimension
    heads: int = 4
    layers: int = 4


def _init_weights(module: nn.Module) -> None:
    """GPT-2 style: N(0, 0.02) for linear and embedding weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class Block(nn.Module):
    def __init__(self, cfg: Config, buggy: bool):
        super().__init__()
        self.buggy = buggy
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(cfg.width)
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.norm2 = nn.LayerNorm(cfg.width)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.width, 4 * cfg.width), nn.GELU(), nn.Linear(4 * cfg.width, cfg.width)
        )
        self.logged_norms: list[float] = []
        if buggy:
            self.gate = nn.Linear(cfg.width, cfg.width)  # BUG: never used in forward

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape  # (B, T, C)
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (
            z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v)
        )  # (B, H, T, D)
        if not self.buggy:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1)  # (B, H, T, T), no 1/sqrt(D) either
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            weights = scores.exp() * mask  # BUG: exp without subtracting the row max overflows
            weights = weights / weights.sum(dim=-1, keepdim=True)
            out = weights @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        if self.buggy:
            self.logged_norms.append(x.norm().item())  # BUG: a host sync in every block
        return x


class TinyLM(nn.Module):
    def __init__(self, cfg: Config, buggy: bool = False):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.width)
        self.position = nn.Embedding(cfg.context, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg, buggy) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied input and output embeddings
        self.apply(_init_weights)
        if buggy:
            for block in self.blocks:
                nn.init.normal_(block.qkv.weight, std=3.0)  # BUG: huge attention logits

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # (B, T, vocab) logits


def build(**overrides) -> TinyLM:
    """The healthy model; keyword arguments override Config fields (e.g. layers=8)."""
    return TinyLM(Config(**overrides))


def build_buggy(**overrides) -> TinyLM:
    """The same model with the three bugs described in the module docstring."""
    torch.manual_seed(0)
    return TinyLM(Config(**overrides), buggy=True)


def make_inputs(batch_size: int = 8) -> torch.Tensor:
    """One batch of random token ids, (batch_size, context)."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, Config.vocab_size, (batch_size, Config.context), generator=generator)


def loss_fn(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy: position t predicts token t+1."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

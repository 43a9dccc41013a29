"""Mid-sized models for bench/gpu_check.py: big enough that activations, not allocator slack, dominate.

Use them as tool references (`bench/gpu/models.py:gpt_medium` with inputs `bench/gpu/models.py:gpt_medium_inputs`).
The plain-torch ones reuse the test zoo's GPT and Llama blocks (tests/fixtures/memory_models.py) at
sizes where the attention back-end matters (T = 1024: a math-SDPA score matrix per layer is
B*H*T*T*4 bytes, 400 MiB for the GPT); `vit_small` is a ViT-S/16-shaped encoder written here;
`encoder_torch` is nn.TransformerEncoder (whose inference path is one fused native op). The `hf_*`
factories build transformers models from configs (no downloads) and need transformers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tests.fixtures import memory_models as mm

GPT_VOCAB, GPT_SEQ = 8192, 1024
LLAMA_VOCAB, LLAMA_SEQ = 8192, 1024
HF_VOCAB, HF_SEQ = 8192, 512


# -- GPT (learned positions, causal SDPA), 6 x 768 ----------------------------------------------
def gpt_medium() -> nn.Module:
    return mm.GPT(vocab=GPT_VOCAB, dim=768, heads=12, layers=6, seq=GPT_SEQ)


def gpt_medium_inputs(batch_size: int = 8) -> torch.Tensor:
    return torch.randint(0, GPT_VOCAB, (batch_size, GPT_SEQ))  # (B, T)


# -- Llama (RMSNorm, rotary, SwiGLU), 4 x 1024 ---------------------------------------------------
def llama_medium() -> nn.Module:
    cfg = mm.LlamaConfig(dim=1024, layers=4, heads=16, ffn=2816, vocab=LLAMA_VOCAB, max_seq=LLAMA_SEQ)
    return mm.Llama(cfg)


def llama_medium_inputs(batch_size: int = 4) -> torch.Tensor:
    return torch.randint(0, LLAMA_VOCAB, (batch_size, LLAMA_SEQ))  # (B, T)


# -- ViT-S/16 shape: 224x224 images, 196 patches + cls, 6 blocks of width 384 ---------------------
class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape  # (B, T, C)
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (
            z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v)
        )  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    def __init__(self, dim: int = 384, depth: int = 6, heads: int = 6, patch: int = 16, classes: int = 1000):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, (224 // patch) ** 2 + 1, dim))
        self.blocks = nn.ModuleList(ViTBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, 3, 224, 224)
        x = self.patch(x).flatten(2).transpose(1, 2)  # (B, 196, C)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos  # (B, 197, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))  # (B, classes)


def vit_small() -> nn.Module:
    return ViT()


def vit_inputs(batch_size: int = 32) -> torch.Tensor:
    return torch.randn(batch_size, 3, 224, 224)  # (B, C, H, W)


# -- nn.TransformerEncoder, BERT-base width, 4 layers ---------------------------------------------
def encoder_torch() -> nn.Module:
    layer = nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)


def encoder_inputs(batch_size: int = 16) -> torch.Tensor:
    return torch.randn(batch_size, 512, 768)  # (B, T, C)


# -- transformers models from configs (need transformers) ------------------------------------------
def hf_gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=HF_VOCAB, n_positions=HF_SEQ, n_embd=768, n_layer=4, n_head=12,
                     bos_token_id=0, eos_token_id=0)  # fmt: skip
    return GPT2LMHeadModel(cfg)


def hf_bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=HF_VOCAB, hidden_size=768, num_hidden_layers=4, num_attention_heads=12,
                     intermediate_size=3072, max_position_embeddings=HF_SEQ)  # fmt: skip
    return BertForMaskedLM(cfg)


def hf_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=HF_VOCAB, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=HF_SEQ)  # fmt: skip
    return LlamaForCausalLM(cfg)


def hf_vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536,
                    image_size=224, patch_size=16, num_labels=1000)  # fmt: skip
    return ViTForImageClassification(cfg)


def hf_lm_batch(batch_size: int = 8) -> dict:
    ids = torch.randint(0, HF_VOCAB, (batch_size, HF_SEQ))  # (B, T)
    return {"input_ids": ids, "labels": ids.clone()}


def hf_image_batch(batch_size: int = 32) -> dict:
    return {
        "pixel_values": torch.randn(batch_size, 3, 224, 224),
        "labels": torch.randint(0, 1000, (batch_size,)),
    }


# -- profile_model: one matmul large enough to keep an H100 busy ------------------------------------
def matmul_8k() -> nn.Module:
    """(8192, 8192) @ (8192, 8192) per forward: 2 * 8192**3 = 1.1 TFLOP."""
    return nn.Linear(8192, 8192, bias=False)

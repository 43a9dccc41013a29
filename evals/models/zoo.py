"""A zoo of real third-party models built from tiny configs (no downloads), healthy and with seeded bugs.

Use the factories as the tools' `model=` (`evals/models/zoo.py:gpt2`), the `*_batch` functions as
`inputs=`, and `write_checkpoints(folder)` to save the checkpoints the verify_checkpoint scenarios
read. The Hugging Face models need the `[zoo]` extra (transformers); `tiny_gpt` is plain torch
with nanoGPT's contract (forward(idx, targets=None) -> (logits, loss), tied embeddings).

Healthy models must give no warning or error finding; each broken copy carries one seeded bug
the tool must find:
- `gpt2_detached_block`: block 1's attention output is detached, so its weights get no gradient;
- `llama_item_in_forward`: every forward reads a value with .item() (a host sync);
- `vit_nan_weights`: one attention weight holds NaN (the checkpoint scenario saves it);
- the broken copy for estimate_memory is `llama_item_in_forward` (forward cannot be traced).

Configs are as small as keeps each architecture's structure (2 layers, width 64), so a tool call
takes seconds on a CPU. The other families (diffusers, PEFT, MoE, SSM, GNN, RNN, audio conv) are in
zoo_families.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 128
SEQ = 16


# -- Hugging Face transformers (the [zoo] extra) ------------------------------------------------
def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(
            n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0
        )
    )


def bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(
        BertConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
            vocab_size=VOCAB,
        )
    )


def t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(
        T5Config(
            d_model=64,
            d_ff=128,
            d_kv=32,
            num_layers=2,
            num_heads=2,
            vocab_size=VOCAB,
            decoder_start_token_id=0,
        )
    )


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=VOCAB,
            max_position_embeddings=64,
            bos_token_id=0,
            eos_token_id=0,
        )
    )


def vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(
        ViTConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
            image_size=32,
            patch_size=8,
            num_labels=10,
        )
    )


def convnext() -> nn.Module:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    return ConvNextForImageClassification(
        ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, drop_path_rate=0.1, num_labels=10)
    )


# -- batches as training code has them ------------------------------------------------------------
def lm_batch(batch_size: int = 2) -> dict:
    """{'input_ids', 'labels'}: the model computes its own loss (output.loss)."""
    ids = torch.randint(1, VOCAB, (batch_size, SEQ), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def seq2seq_batch(batch_size: int = 2) -> dict:
    ids = torch.randint(1, VOCAB, (batch_size, SEQ), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.flip(1).contiguous()}


def image_batch(batch_size: int = 2) -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "pixel_values": torch.randn(batch_size, 3, 32, 32, generator=g),
        "labels": torch.randint(0, 10, (batch_size,), generator=g),
    }


def image_pair(batch_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, class targets), as a torchvision-style loader yields them."""
    batch = image_batch(batch_size)
    return batch["pixel_values"], batch["labels"]


def token_pair(batch_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx, targets) shifted by one, nanoGPT's get_batch."""
    ids = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=torch.Generator().manual_seed(0))
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


# -- a nanoGPT-style model in plain torch ----------------------------------------------------------
class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape  # (B, T, C)
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (
            z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v)
        )  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """nanoGPT's contract: tied token embedding and head, forward(idx, targets=None) -> (logits, loss)."""

    def __init__(self, width: int = 64, layers: int = 2, heads: int = 2) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, width), nn.Embedding(SEQ, width)
        self.blocks = nn.ModuleList(_Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def tiny_gpt() -> nn.Module:
    return TinyGPT()


# -- broken copies ---------------------------------------------------------------------------------
def gpt2_detached_block() -> nn.Module:
    """GPT-2 whose block 1 attention output is detached: c_attn/c_proj of that block get no gradient."""
    model = gpt2()

    def detach(_module, _inputs, output):
        return (output[0].detach(), *output[1:]) if isinstance(output, tuple) else output.detach()

    model.transformer.h[1].attn.register_forward_hook(detach)
    return model


class _ItemEveryStep(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None):
        out = self.inner(input_ids=input_ids, labels=labels)
        self.last_loss = out.loss.item()  # a host sync every step, the classic logging bug
        return out


def llama_item_in_forward() -> nn.Module:
    return _ItemEveryStep(llama())


def vit_nan_weights() -> nn.Module:
    model = vit()
    # the first attention projection, whatever this transformers version calls it (query, q_proj)
    name, weight = next((n, p) for n, p in model.named_parameters() if "attention" in n and p.dim() == 2)
    with torch.no_grad():
        weight[0, 0] = float("nan")
    return model


# -- checkpoints for verify_checkpoint --------------------------------------------------------------
CHECKPOINTS = Path(__file__).with_name("zoo_checkpoints")  # generated, git-ignored


def write_checkpoints(folder: Path = CHECKPOINTS) -> Path:
    """Save each checkpoint the zoo scenarios read (idempotent): save_pretrained folders and a .pt."""
    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(tiny_gpt().state_dict(), folder / "tiny_gpt.pt")  # tied: both keys, one storage
    try:
        import transformers  # noqa: F401
    except ImportError:
        return folder
    for name, factory in (
        ("gpt2", gpt2),
        ("t5", t5),
        ("vit", vit),
        ("vit_nan", vit_nan_weights),
        ("bert", bert),
    ):
        target = folder / name
        if not (target / "model.safetensors").exists():
            factory().save_pretrained(target)
    return folder

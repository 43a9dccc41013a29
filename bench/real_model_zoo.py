"""Real transformers models at 10-100M parameters, built from configs (no downloads), for bench/real_models.py.

Use as the tools' `model=` (`bench/real_model_zoo.py:gpt2`) with the matching `inputs=`
(`lm_batch`, `image_batch`, `image_pair`), or call the factories directly. Needs the [zoo] extra.
Sizes (parameters): gpt2 ~27M, bert ~29M, vit ~15M, resnet ~11M (a ResNet-18 layout).
Batches are small (4 sequences of 128 tokens, 4 images) so one step takes about a second on one core.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 16384
SEQ = 128
IMAGE = 64  # ResNet input side
VIT_IMAGE = 128  # ViT input side: (128 / 16)^2 = 64 patches


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(
            n_layer=6, n_embd=512, n_head=8, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0
        )
    )


def bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(
        BertConfig(
            hidden_size=512,
            num_hidden_layers=6,
            num_attention_heads=8,
            intermediate_size=2048,
            vocab_size=VOCAB,
            max_position_embeddings=SEQ,
        )
    )


def vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(
        ViTConfig(
            hidden_size=384,
            num_hidden_layers=8,
            num_attention_heads=6,
            intermediate_size=1536,
            image_size=VIT_IMAGE,
            patch_size=16,
            num_labels=100,
        )
    )


def resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    return ResNetForImageClassification(
        ResNetConfig(
            embedding_size=64,
            hidden_sizes=[64, 128, 256, 512],
            depths=[2, 2, 2, 2],
            layer_type="basic",
            num_labels=100,
        )
    )


def lm_batch(batch_size: int = 4) -> dict:
    """{'input_ids', 'labels'}: the model computes its own loss (output.loss)."""
    ids = torch.randint(1, VOCAB, (batch_size, SEQ), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def image_batch(batch_size: int = 4, side: int = VIT_IMAGE) -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "pixel_values": torch.randn(batch_size, 3, side, side, generator=g),
        "labels": torch.randint(0, 100, (batch_size,), generator=g),
    }


def image_pair(batch_size: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, class targets), as a torchvision-style loader yields them."""
    batch = image_batch(batch_size, IMAGE)
    return batch["pixel_values"], batch["labels"]

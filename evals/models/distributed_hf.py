"""Hugging Face models for the check_distributed evals, built from small configs (never downloaded).

transformers is imported at the top so the tool imports it once before forking the ranks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

VOCAB, SEQ = 64, 16


def gpt2():
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2))


def lm_batch(batch_size: int = 8):
    ids = torch.randint(0, VOCAB, (batch_size, SEQ))
    return {"input_ids": ids, "labels": ids.clone()}


def token_sum_loss(output, batch):
    """Cross-entropy summed over tokens (a common port of a single-GPU script)."""
    logits = output.logits[:, :-1].reshape(-1, VOCAB)
    return F.cross_entropy(logits, batch["labels"][:, 1:].reshape(-1), reduction="sum")


def bert_encoder():
    """BertModel with its pooler, trained on the token states only (the pooler never gets a gradient)."""
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    return BertModel(config)


def token_states_loss(output, batch):
    return output.last_hidden_state.pow(2).mean()


def ids_batch(batch_size: int = 8):
    return {"input_ids": torch.randint(0, VOCAB, (batch_size, SEQ))}


def lm_loader(rank: int, world_size: int):
    """A token dataset in a DataLoader with shuffle=True and no DistributedSampler."""
    ids = torch.randint(0, VOCAB, (64, SEQ), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]
    return torch.utils.data.DataLoader(
        data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
